"""Run a target or the oracle on a case: forward outputs and VJPs, through
jitted callables cached per (function, static arguments) at module level,
so a shape seen before never compiles again. Counts XLA compiles."""

from __future__ import annotations

import functools
import threading
from typing import Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gdn_kernels import api as reference_api
from gdn_kernels.interpret import resolved_mode
from strategies import cotangent, delta_rule_inputs, mixer_inputs, segment_ids_of
from strategies.cases import DeltaRuleCase, MixerCase

from .targets import Target

DELTA_INPUTS = ("q", "k", "v", "g", "beta", "initial_state")
MIXER_INPUTS = ("x", "conv_weight", "a", "b", "a_log", "dt_bias")

# -------------------------------------------------------------- compile count
_compiles = {"n": 0}
_lock = threading.Lock()


def _on_event(event: str, duration: float, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        with _lock:
            _compiles["n"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def compile_count() -> int:
    """XLA backend compiles so far in this process."""
    return _compiles["n"]


# -------------------------------------------------------------- memory maps
def _count_lines(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return -1


def release_executables_if_needed(fraction: float = 0.5) -> bool:
    """Drop every compiled executable when this process uses more than
    `fraction` of the kernel's vm.max_map_count memory maps.

    Each XLA:CPU executable of the suite holds ~275 memory maps (measured);
    after ~230 compiles a process hits the default limit of 65530 and XLA
    segfaults while compiling the next one. Releasing the caches frees the
    maps; a later example of a seen shape simply compiles again."""
    used = _count_lines("/proc/self/maps")
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return False
    if used < 0 or used < fraction * limit:
        return False
    import gc
    _vjp_runner.cache_clear()
    _forward_runner.cache_clear()
    jax.clear_caches()
    gc.collect()
    return True


# -------------------------------------------------------------- static args
def delta_static(case: DeltaRuleCase) -> Tuple:
    return (("chunk_size", case.chunk),)


def mixer_static(case: MixerCase) -> Tuple:
    return (("num_k_heads", case.k_heads), ("num_v_heads", case.v_heads),
            ("head_k_dim", case.dk), ("head_v_dim", case.dv),
            ("use_qk_norm", case.use_qk_norm), ("eps", case.eps),
            ("chunk_size", case.chunk))


# -------------------------------------------------------------- runners
def _caller(fn: Callable, op: str, static: Tuple, has_state: bool):
    """call(arrays, ids) -> fn's outputs: the last array is initial_state
    when has_state (delta rule); ids (segment_ids, traced) or None is
    passed only when given, so targets without packing still run."""
    kw = dict(static)

    def call(arrays, ids):
        extra = {} if ids is None else {"segment_ids": ids}
        if op == "delta" and has_state:
            *act, s0 = arrays
            return fn(*act, initial_state=s0, **extra, **kw)
        return fn(*arrays, **extra, **kw)

    return call


@functools.lru_cache(maxsize=None)
def _vjp_runner(fn: Callable, op: str, static: Tuple, has_state: bool, mode: str):
    """jit((arrays, cotangents, ids) -> (outputs, grads)) for one op; `mode`
    (the GDN_INTERPRET mode read now) keys the cache, so a mode change
    retraces. ids: segment_ids [B, T] (traced) or None."""
    del mode
    call = _caller(fn, op, static, has_state)

    def run(arrays, cts, ids):
        out, pullback = jax.vjp(lambda *a: call(a, ids), *arrays)
        outs = out if isinstance(out, tuple) else (out,)
        cts = tuple(c.astype(o.dtype) for c, o in zip(cts, outs))
        return out, pullback(cts if isinstance(out, tuple) else cts[0])

    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _forward_runner(fn: Callable, op: str, static: Tuple, has_state: bool, mode: str):
    del mode
    call = _caller(fn, op, static, has_state)
    return jax.jit(lambda arrays, ids: call(arrays, ids))


def target_fn(target: Target, op: str):
    """The target's function for op "delta" (gated_delta_rule) or "mixer"."""
    return target.gated_delta_rule if op == "delta" else target.gdn_decoupled_conv1d


def _oracle_fn(op: str):
    if op == "delta":
        return functools.partial(reference_api.gated_delta_rule, impl="reference")
    return functools.partial(reference_api.gdn_decoupled_conv1d, impl="reference")


_ORACLE_FNS = {"delta": _oracle_fn("delta"), "mixer": _oracle_fn("mixer")}


# -------------------------------------------------------------- inputs
def case_op(case) -> str:
    return "delta" if isinstance(case, DeltaRuleCase) else "mixer"


def case_inputs(case) -> Dict[str, np.ndarray]:
    """Named numpy inputs of a case (initial_state dropped when None)."""
    if isinstance(case, DeltaRuleCase):
        inputs = delta_rule_inputs(case)
        if inputs["initial_state"] is None:
            del inputs["initial_state"]
        return inputs
    return mixer_inputs(case)


def _static(case) -> Tuple:
    return delta_static(case) if isinstance(case, DeltaRuleCase) else mixer_static(case)


def output_names(case) -> Tuple[str, ...]:
    return ("o", "final_state") if isinstance(case, DeltaRuleCase) else ("o",)


def output_cotangents(case, out_shapes) -> Tuple[np.ndarray, ...]:
    """A random float64 cotangent per output (the final-state cotangent too)."""
    return tuple(cotangent(case.seed + i, s) for i, s in enumerate(out_shapes))


def _out_shapes(case):
    b, t, hv = case.batch, case.seq_len, case.v_heads
    shapes = [(b, t, hv, case.dv)]
    if isinstance(case, DeltaRuleCase):
        shapes.append((b, hv, case.dk, case.dv))
    return shapes


# -------------------------------------------------------------- public runs
def run_vjp(fn, case, inputs, cts, *, x64=False):
    """(outputs tuple, grads dict) of fn on the named inputs, as numpy
    (segment_ids from the case when it is packed)."""
    op = case_op(case)
    names = tuple(inputs)
    has_state = "initial_state" in inputs
    runner = _vjp_runner(fn, op, _static(case), has_state, resolved_mode())
    ids = segment_ids_of(case)
    if x64:
        with jax.enable_x64(True):
            arrays = tuple(np.asarray(inputs[n], np.float64) for n in names)
            out, grads = runner(arrays, tuple(np.asarray(c, np.float64) for c in cts), ids)
    else:
        arrays = tuple(np.asarray(inputs[n]) for n in names)
        out, grads = runner(arrays, cts, ids)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o) for o in out), {n: np.asarray(g) for n, g in zip(names, grads)}


def run_forward(fn, case, inputs, *, x64=False):
    op = case_op(case)
    names = tuple(inputs)
    runner = _forward_runner(fn, op, _static(case), "initial_state" in inputs,
                             resolved_mode())
    ids = segment_ids_of(case)
    if x64:
        with jax.enable_x64(True):
            out = runner(tuple(np.asarray(inputs[n], np.float64) for n in names), ids)
    else:
        out = runner(tuple(np.asarray(inputs[n]) for n in names), ids)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o) for o in out)


def target_vjp(target: Target, case, inputs=None):
    """The target's outputs and input cotangents on a case."""
    inputs = case_inputs(case) if inputs is None else inputs
    cts = cotangents(case)
    return run_vjp(target_fn(target, case_op(case)), case, inputs,
                   tuple(c.astype(np.float32) for c in cts))


def oracle_vjp(case, inputs=None):
    """The float64 oracle's outputs and cotangents (same input values)."""
    inputs = case_inputs(case) if inputs is None else inputs
    return run_vjp(_ORACLE_FNS[case_op(case)], case, inputs, cotangents(case), x64=True)


def reference_vjp(case, inputs=None):
    """The same-precision reference (token scan on the case's dtypes)."""
    inputs = case_inputs(case) if inputs is None else inputs
    cts = cotangents(case)
    return run_vjp(_ORACLE_FNS[case_op(case)], case, inputs,
                   tuple(c.astype(np.float32) for c in cts))


def target_forward(target: Target, case, inputs=None):
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(target_fn(target, case_op(case)), case, inputs)


def oracle_forward(case, inputs=None):
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(_ORACLE_FNS[case_op(case)], case, inputs, x64=True)


def reference_forward(case, inputs=None):
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(_ORACLE_FNS[case_op(case)], case, inputs)


def cotangents(case):
    """The case's float64 output cotangents (one per output)."""
    return output_cotangents(case, _out_shapes(case))
