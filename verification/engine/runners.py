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

from gdn_kernels import GDNState
from gdn_kernels import api as reference_api
from gdn_kernels import reference
from gdn_kernels.interpret import resolved_mode
from strategies import cotangent, delta_rule_inputs, mixer_inputs, segment_ids_of
from strategies.cases import DeltaRuleCase, MixerCase

from . import program_store
from ..targets.declaration import OutsideLimits
from ..targets import Target
from ..tolerance import CONTRACT_PRECISION, PRECISIONS

DELTA_INPUTS = ("q", "k", "v", "g", "beta", "initial_state")
MIXER_INPUTS = ("x", "conv_weight", "a", "b", "a_log", "dt_bias")

# -------------------------------------------------------------- compile count
# n: programs built (an XLA compile, or an executable read from the
# persistent compilation cache: either way a jit cache miss, which the
# recompilation properties count); hits: those read from the cache.
_compiles = {"n": 0, "s": 0.0, "hits": 0}
_lock = threading.Lock()
# Where a new program's time goes before it runs: tracing to a jaxpr,
# lowering to StableHLO, XLA's compile or the persistent cache's read (the
# last one counts the programs: JAX times compile_or_get_cached as a whole,
# so a cache hit fires it too, after its cache_hits event).
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def _on_event(event: str, duration: float, **_):
    if event in _COMPILE_EVENTS:
        with _lock:
            _compiles["s"] += duration
            _compiles["n"] += event == _COMPILE_EVENTS[-1]


def _on_plain_event(event: str, **_):
    if event == _CACHE_HIT:
        with _lock:
            _compiles["hits"] += 1


_CACHE_HIT = "/jax/compilation_cache/cache_hits"
jax.monitoring.register_event_duration_secs_listener(_on_event)
jax.monitoring.register_event_listener(_on_plain_event)


def cache_hit_count() -> int:
    """Programs this process read from the persistent compilation cache or
    loaded from the program store (verification/engine/program_store.py)."""
    return _compiles["hits"] + program_store.counts()["loaded"]


# What the mesh workers (verification/engine/mesh_worker.py) built for this
# process's checks, as they report it.
_worker_compiles = {"n": 0, "s": 0.0}


def count_worker_compiles(n: int, seconds: float) -> None:
    """Add what a mesh worker reports it built for one of our checks."""
    with _lock:
        _worker_compiles["n"] += n
        _worker_compiles["s"] += seconds


def compile_count() -> int:
    """Programs built so far for this process's checks (XLA compiles and
    persistent-cache reads): its own and those its mesh workers ran."""
    return _compiles["n"] + program_store.counts()["loaded"] + _worker_compiles["n"]


def compile_seconds() -> float:
    """Seconds spent tracing, lowering and compiling so far, this process's
    and its mesh workers'."""
    return _compiles["s"] + _worker_compiles["s"]


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

    Each XLA:CPU executable of the suite holds ~275 memory maps (measured
    with XLA's parallel code generation; ~70 with the suite's compile
    settings, verification/engine/compile_settings.py); after ~230 (~900)
    compiles a process hits the default limit of 65530 and XLA segfaults
    while compiling the next one. Releasing the caches frees the
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
    _pieces_runner.cache_clear()
    program_store.clear()
    jax.clear_caches()
    gc.collect()
    return True


# -------------------------------------------------------------- static args
def _scale(case) -> Tuple:
    """scale= where the case passes one (none at the default: the call, and
    its compiled program, are those of a case without the argument)."""
    return () if case.scale is None else (("scale", case.scale),)


def delta_static(case: DeltaRuleCase) -> Tuple:
    return (("chunk_size", case.chunk),) + _scale(case)


def mixer_static(case: MixerCase) -> Tuple:
    return (("num_k_heads", case.k_heads), ("num_v_heads", case.v_heads),
            ("head_k_dim", case.dk), ("head_v_dim", case.dv),
            ("use_qk_norm", case.use_qk_norm), ("eps", case.eps),
            ("chunk_size", case.chunk)) + _scale(case)


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
    return jax.jit(_vjp_program(fn, op, static, has_state))


def _vjp_program(fn: Callable, op: str, static: Tuple, has_state: bool):
    """(arrays, cotangents, ids) -> (outputs, grads): a new function each
    call, so tracing it runs the target's Python again."""
    call = _caller(fn, op, static, has_state)

    def run(arrays, cts, ids):
        out, pullback = jax.vjp(lambda *a: call(a, ids), *arrays)
        outs = out if isinstance(out, tuple) else (out,)
        cts = tuple(c.astype(o.dtype) for c, o in zip(cts, outs))
        return out, pullback(cts if isinstance(out, tuple) else cts[0])

    return run


@functools.lru_cache(maxsize=None)
def _forward_runner(fn: Callable, op: str, static: Tuple, has_state: bool, mode: str):
    del mode
    call = _caller(fn, op, static, has_state)
    return jax.jit(lambda arrays, ids: call(arrays, ids))


def target_fn(target: Target, op: str):
    """The target's function for op "delta" (gated_delta_rule) or "mixer"."""
    return target.gated_delta_rule if op == "delta" else target.gdn_decoupled_conv1d


def _oracle_fn(op: str):
    """The oracle's public function for op, taking the case's chunk_size and
    ignoring it: the token scan has no chunks, and a target may declare
    chunk sizes beyond the contract's (strategies.lattice.BEYOND_CONTRACT_CHUNKS)."""
    public = reference_api.gated_delta_rule if op == "delta" else reference_api.gdn_decoupled_conv1d

    def oracle(*args, chunk_size=None, **kwargs):
        del chunk_size
        return public(*args, impl="reference", **kwargs)
    return oracle


_ORACLE_FNS = {"delta": _oracle_fn("delta"), "mixer": _oracle_fn("mixer")}


@functools.lru_cache(maxsize=None)
def reference_fn(op: str, precision: str = CONTRACT_PRECISION):
    """The same-precision reference's function for op "delta" or "mixer" at
    a declared precision (tolerance.PRECISIONS): the token scan under its
    rounding model, with the contract's signature (the oracle's own
    function for the contract's precision). One object per (op, precision),
    so its programs are cached like any other."""
    if precision == CONTRACT_PRECISION:
        return _ORACLE_FNS[op]
    declared = PRECISIONS[precision]
    rounding = reference.Rounding(products=declared.products, state=declared.state)
    if op == "delta":
        def rounded_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                               segment_ids=None, chunk_size=None):
            del chunk_size      # the token scan has no chunks
            scale = q.shape[-1] ** -0.5 if scale is None else scale
            return reference.token_scan(q, k, v, g, beta, scale, initial_state, segment_ids,
                                        rounding)
        return rounded_delta_rule

    def rounded_mixer(x, conv_weight, a, b, a_log, dt_bias, *, head_k_dim, scale=None,
                      **contract_kwargs):
        scale = head_k_dim ** -0.5 if scale is None else scale
        return reference.reference_mixer(x, conv_weight, a, b, a_log, dt_bias,
                                         head_k_dim=head_k_dim, scale=scale,
                                         rounding=rounding, **contract_kwargs)
    return rounded_mixer


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
            out, grads = program_store.call(runner, arrays,
                                            tuple(np.asarray(c, np.float64) for c in cts), ids)
    else:
        arrays = tuple(np.asarray(inputs[n]) for n in names)
        out, grads = program_store.call(runner, arrays, cts, ids)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o) for o in out), {n: np.asarray(g) for n, g in zip(names, grads)}


def compiled_vjp_text(fn, case, inputs) -> str:
    """The compiled HLO text (compiled, not run) of the VJP program of fn on
    the case's shapes: run_vjp's for the core op; for the mixer run_pieces'
    single call, from an incoming state and returning it (through the
    program store: a warm run reads it from the stored executable)."""
    names = tuple(inputs)
    arrays = tuple(np.asarray(inputs[n]) for n in names)
    ids = segment_ids_of(case)
    if case_op(case) == "mixer":
        runner = _pieces_runner(fn, mixer_static(case), (case.seq_len,), resolved_mode())
        zeros = [np.zeros(s, np.float32) for s in _state_shapes(case)]
        state = GDNState(zeros[0].astype(arrays[0].dtype), zeros[1])
        cts = (np.zeros(_out_shapes(case)[0], np.float32), GDNState(*zeros))
        return program_store.compiled_text(runner, arrays, state, cts, ids)
    runner = _vjp_runner(fn, case_op(case), _static(case), "initial_state" in inputs,
                         resolved_mode())
    cts = tuple(c.astype(np.float32) for c in cotangents(case))
    return program_store.compiled_text(runner, arrays, cts, ids)


def run_forward(fn, case, inputs, *, x64=False):
    op = case_op(case)
    names = tuple(inputs)
    runner = _forward_runner(fn, op, _static(case), "initial_state" in inputs,
                             resolved_mode())
    ids = segment_ids_of(case)
    if x64:
        with jax.enable_x64(True):
            out = program_store.call(
                runner, tuple(np.asarray(inputs[n], np.float64) for n in names), ids)
    else:
        out = program_store.call(runner, tuple(np.asarray(inputs[n]) for n in names), ids)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(np.asarray(o) for o in out)


def within_limits(target: Target, case, lengths: Tuple[int, ...] = ()) -> None:
    """Raise declaration.OutsideLimits when the target's declared limits
    refuse the case, or calls of these lengths (pieces of its row)."""
    limits = target.declaration.limits
    reason = limits.refuses_case(case) or next(
        (r for r in (limits.refuses(t, case.chunk, case.batch) for t in lengths) if r), None)
    if reason:
        raise OutsideLimits(reason)


def target_vjp(target: Target, case, inputs=None):
    """The target's outputs and input cotangents on a case."""
    within_limits(target, case)
    inputs = case_inputs(case) if inputs is None else inputs
    cts = cotangents(case)
    return run_vjp(target_fn(target, case_op(case)), case, inputs,
                   tuple(c.astype(np.float32) for c in cts))


def oracle_vjp(case, inputs=None):
    """The float64 oracle's outputs and cotangents (same input values)."""
    inputs = case_inputs(case) if inputs is None else inputs
    return run_vjp(_ORACLE_FNS[case_op(case)], case, inputs, cotangents(case), x64=True)


def reference_vjp(case, inputs=None, precision: str = CONTRACT_PRECISION):
    """The same-precision reference (token scan on the case's dtypes, under
    the rounding model of a declared precision)."""
    inputs = case_inputs(case) if inputs is None else inputs
    cts = cotangents(case)
    return run_vjp(reference_fn(case_op(case), precision), case, inputs,
                   tuple(c.astype(np.float32) for c in cts))


def target_vjp_shapes(target: Target, case, inputs=None):
    """The target's outputs and input cotangents on a case as
    jax.ShapeDtypeStruct (outputs tuple, grads dict), by tracing the VJP
    program afresh (compiling and running nothing), so trace-time records
    (verification.targets.adapters.recording_deviations) see every call."""
    within_limits(target, case)
    inputs = case_inputs(case) if inputs is None else inputs
    names = tuple(inputs)
    program = _vjp_program(target_fn(target, case_op(case)), case_op(case), _static(case),
                           "initial_state" in inputs)
    arrays = tuple(np.asarray(inputs[n]) for n in names)
    cts = tuple(c.astype(np.float32) for c in cotangents(case))
    out, grads = jax.eval_shape(program, arrays, cts, segment_ids_of(case))
    out = out if isinstance(out, tuple) else (out,)
    return tuple(out), dict(zip(names, grads))


def target_forward(target: Target, case, inputs=None):
    within_limits(target, case)
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(target_fn(target, case_op(case)), case, inputs)


def oracle_forward(case, inputs=None):
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(_ORACLE_FNS[case_op(case)], case, inputs, x64=True)


def reference_forward(case, inputs=None, precision: str = CONTRACT_PRECISION):
    inputs = case_inputs(case) if inputs is None else inputs
    return run_forward(reference_fn(case_op(case), precision), case, inputs)


def cotangents(case):
    """The case's float64 output cotangents (one per output)."""
    return output_cotangents(case, _out_shapes(case))


# -------------------------------------------------------------- carried state
STATE_LEAVES = ("conv", "recurrent")


def _time_slice(x, start: int, stop: int, seq_len: int):
    """x [B, T, ...] cut to tokens [start, stop); a parameter without a
    T axis (rank < 3, or a broadcast time axis of size 1) as it is."""
    if x.ndim == 3 and x.shape[1] == seq_len and seq_len > 1:
        return x[:, start:stop]
    return x


@functools.lru_cache(maxsize=None)
def _pieces_runner(fn: Callable, static: Tuple, pieces: Tuple[int, ...], mode: str):
    """jit((arrays, state, cts, ids) -> ((o, GDNState), (grads, d_state))):
    the mixer called once per piece of the row, each call taking the state
    the previous one returned; the VJP of the whole program."""
    del mode
    kw = dict(static)
    seq_len = sum(pieces)

    def program(arrays, state, ids):
        x, w, a, b, a_log, dt_bias = arrays
        outs, t0 = [], 0
        for n in pieces:
            cut = functools.partial(_time_slice, start=t0, stop=t0 + n, seq_len=seq_len)
            extra = {} if ids is None else {"segment_ids": ids[:, t0:t0 + n]}
            o, state = fn(cut(x), w, cut(a), cut(b), cut(a_log), cut(dt_bias),
                          state=state, return_state=True, **extra, **kw)
            outs.append(o)
            t0 += n
        return jnp.concatenate(outs, axis=1), state

    def run(arrays, state, cts, ids):
        out, pullback = jax.vjp(lambda arr, st: program(arr, st, ids), arrays, state)
        o, st = out
        cts = (cts[0].astype(o.dtype), type(st)(*(c.astype(s.dtype) for c, s in zip(cts[1], st))))
        return out, pullback(cts)

    return jax.jit(run)


def run_pieces(fn, case: MixerCase, inputs, state, pieces, *, x64=False):
    """The mixer `fn` on a case cut into calls of `pieces` tokens, chaining
    the carried state from `state` ({"conv", "recurrent"} numpy). Returns
    (outputs {"o", "conv", "recurrent"}, grads {input name, "state.conv",
    "state.recurrent"}) as numpy, for the case's cotangents of o and of the
    final state."""
    names = MIXER_INPUTS
    runner = _pieces_runner(fn, mixer_static(case), tuple(pieces), resolved_mode())
    ids = segment_ids_of(case)
    ct_o, ct_conv, ct_rec = state_cotangents(case)
    cast = (lambda a: np.asarray(a, np.float64)) if x64 else np.asarray
    ct_cast = (lambda a: np.asarray(a, np.float64)) if x64 else (lambda a: a.astype(np.float32))
    with jax.enable_x64(x64):
        arrays = tuple(cast(inputs[n]) for n in names)
        st = GDNState(cast(state["conv"]), cast(state["recurrent"]))
        cts = (ct_cast(ct_o), GDNState(ct_cast(ct_conv), ct_cast(ct_rec)))
        (o, st_out), (grads, d_state) = program_store.call(runner, arrays, st, cts, ids)
    outs = {"o": np.asarray(o), "conv": np.asarray(st_out.conv),
            "recurrent": np.asarray(st_out.recurrent)}
    grads = {n: np.asarray(g) for n, g in zip(names, grads)}
    grads.update({"state.conv": np.asarray(d_state.conv),
                  "state.recurrent": np.asarray(d_state.recurrent)})
    return outs, grads


def _state_shapes(case: MixerCase):
    """GDNState leaf shapes: conv [B, K-1, C], recurrent [B, Hv, Dk, Dv]."""
    return [(case.batch, case.conv_width - 1, case.channels),
            (case.batch, case.v_heads, case.dk, case.dv)]


def state_cotangents(case: MixerCase):
    """float64 cotangents of o [B, T, Hv, Dv], the returned conv state
    [B, K-1, C] and recurrent state [B, Hv, Dk, Dv]."""
    return output_cotangents(case, _out_shapes(case) + _state_shapes(case))


def oracle_fn(op: str):
    """The oracle's public function for op "delta" or "mixer" (impl="reference")."""
    return _ORACLE_FNS[op]
