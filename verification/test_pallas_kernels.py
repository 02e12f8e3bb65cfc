"""The Pallas backend (impl="pallas") against the float64 token-scan oracle,
against its XLA twin, in the TPU simulator, and lowered for real TPUs.

Groups:
  a. pallas vs float64 reference: rel L2 <= 1e-5 (outputs, final state),
     <= 1e-4 (every gradient) for float32 inputs, <= 2e-2 for bfloat16;
     float64 inputs through the pallas kernels agree to 1e-12.
  b. GDN_INTERPRET=tpu-sim: small cases match the reference, no NaN.
  c. GDN_INTERPRET=off: both ops and their gradients lower for TPU from this
     CPU machine and yield the forward / backward Mosaic kernels.
  d. pallas vs xla (float32) rel L2 <= 1e-6; two runs of each bitwise identical.

Cases are a hand-picked sample of the lattice T in {1, C-1, C, C+1, 3C+5},
C in {16, 32, 64}, Hv/Hk in {1, 2, 4}, Dk != Dv, gate-parameter ranks 1/2/3,
all-zero q/k rows, a non-zero initial state; every value appears at least
once. Inputs come from numpy with a per-case seed; jitted callables and
results are cached per (case, impl, interpret mode), so every shape compiles
once per impl.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import gdn_kernels as gk
from gdn_kernels import interpret

F32_OUT_TOL = 1e-5
F32_GRAD_TOL = 1e-4
BF16_TOL = 2e-2
F64_TOL = 1e-12
# pallas vs xla, float32. Both backends run the same chunk_math functions;
# what differs is how XLA:CPU compiles them (one 2-D chunk per grid step vs
# all chunks vmapped), e.g. the summation order of the matrix-vector dots
# behind the in-chunk reverse cumulative and column sums (1-ulp differences).
# Measured worst: 2.6e-7 (dg), everything else <= 1.3e-7, outputs mostly
# bitwise equal.
TWIN_TOL = 1e-6

# worst relative error seen per (group, tensor), printed at the end (-s)
WORST: dict[tuple[str, str], float] = {}


# --------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    op: str            # "delta" (gated_delta_rule) or "mixer" (gdn_decoupled_conv1d)
    b: int
    t: int
    chunk: int
    hk: int
    group: int         # Hv / Hk
    dk: int
    dv: int
    dtype: str = "float32"
    zero_rows: bool = False
    param_rank: int = 1  # mixer: rank of a_log / dt_bias
    seed: int = 0

    @property
    def hv(self):
        return self.hk * self.group

    def __str__(self):
        return (f"{self.op}-B{self.b}T{self.t}C{self.chunk}Hk{self.hk}Hv{self.hv}"
                f"Dk{self.dk}Dv{self.dv}-{self.dtype}"
                + ("-zero" if self.zero_rows else "")
                + (f"-r{self.param_rank}" if self.op == "mixer" else ""))


D = functools.partial(Case, "delta")
M = functools.partial(Case, "mixer")

CASES = [
    # gated_delta_rule
    D(1, 1, 16, 1, 1, 16, 32, seed=1),                       # T=1
    D(1, 15, 16, 2, 1, 32, 16, zero_rows=True, seed=2),      # C-1
    D(1, 16, 16, 1, 2, 16, 32, seed=3),                      # C
    D(2, 17, 16, 1, 4, 32, 16, seed=4),                      # C+1
                                                             # 3C+5: T=101, 197
    D(1, 101, 32, 1, 4, 32, 64, seed=8),
    D(1, 64, 64, 1, 2, 64, 32, seed=9),
    D(1, 197, 64, 2, 2, 32, 64, zero_rows=True, seed=10),
    D(1, 63, 64, 1, 4, 32, 16, dtype="bfloat16", seed=11),
    D(2, 65, 64, 1, 2, 16, 32, dtype="bfloat16", zero_rows=True, seed=12),
    # gdn_decoupled_conv1d
    M(1, 1, 64, 1, 2, 16, 32, param_rank=1, seed=21),
    M(2, 17, 16, 1, 2, 16, 32, param_rank=2, seed=22),
    M(1, 32, 32, 1, 4, 32, 16, param_rank=3, zero_rows=True, seed=23),
    M(1, 101, 32, 2, 1, 16, 32, param_rank=2, seed=24),
    M(1, 65, 64, 1, 2, 32, 16, param_rank=3, seed=25),
    M(1, 33, 32, 1, 2, 16, 32, param_rank=1, dtype="bfloat16", zero_rows=True, seed=26),
]
F32_CASES = [c for c in CASES if c.dtype == "float32"]

# The TPU simulator runs ~2 ms per grid step: the cases with at most 8 grid
# steps (B * Hv * chunks), which share their float64 references with group a.
SIM_MAX_STEPS = 8
SIM_CASES = [c for c in CASES if c.b * c.hv * -(-c.t // c.chunk) <= SIM_MAX_STEPS]


# --------------------------------------------------------------------------
# inputs (numpy, from the case seed)
# --------------------------------------------------------------------------

def _delta_inputs(c: Case):
    """(primals, cotangents) as float64 numpy arrays."""
    rng = np.random.default_rng(c.seed)
    q = rng.standard_normal((c.b, c.t, c.hk, c.dk))
    k = rng.standard_normal((c.b, c.t, c.hk, c.dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    if c.zero_rows:
        q[:, ::3, 0] = 0.0
        k[:, 1::4, -1] = 0.0
        q[:, -1] = 0.0
    v = rng.standard_normal((c.b, c.t, c.hv, c.dv))
    g = np.log(rng.uniform(0.5, 1.0, (c.b, c.t, c.hv)))
    beta = rng.uniform(0.05, 0.95, (c.b, c.t, c.hv))
    s0 = 0.5 * rng.standard_normal((c.b, c.hv, c.dk, c.dv))
    do = rng.standard_normal((c.b, c.t, c.hv, c.dv))
    ds = rng.standard_normal((c.b, c.hv, c.dk, c.dv))
    return (q, k, v, g, beta, s0), (do, ds)


def _mixer_inputs(c: Case):
    rng = np.random.default_rng(c.seed)
    nq = c.hk * c.dk
    channels = 2 * nq + c.hv * c.dv
    x = rng.standard_normal((c.b, c.t, channels))
    if c.zero_rows:
        # silu(0) = 0: q of key head 0 and k of the last key head vanish for
        # tokens whose whole conv window is zero.
        x[:, :min(c.t, 6), :c.dk] = 0.0
        x[:, :, 2 * nq - c.dk:2 * nq][:, -min(c.t, 5):] = 0.0
    w = 0.5 * rng.standard_normal((4, channels))
    a = rng.standard_normal((c.b, c.t, c.hv))
    bb = rng.standard_normal((c.b, c.t, c.hv))
    shape = {1: (c.hv,), 2: (c.b, c.hv), 3: (1, c.t, c.hv)}[c.param_rank]
    a_log = 0.5 * rng.standard_normal(shape)
    dt_bias = 0.5 * rng.standard_normal(shape)
    do = rng.standard_normal((c.b, c.t, c.hv, c.dv))
    return (x, w, a, bb, a_log, dt_bias), (do,)


# float32 parameters / state next to bf16 activations (the mixed-precision case)
_DELTA_STATE_ARGS = (5,)
_MIXER_PARAM_ARGS = (1, 4, 5)
DELTA_NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "ds0")
MIXER_NAMES = ("o", "dx", "dconv_weight", "da", "db", "da_log", "ddt_bias")


def _names(c: Case):
    return DELTA_NAMES if c.op == "delta" else MIXER_NAMES


def _raw_inputs(c):
    return _delta_inputs(c) if c.op == "delta" else _mixer_inputs(c)


def _kernel_inputs(c: Case):
    """(primals, cotangents) as jnp arrays in the kernel dtypes: activations
    (and the output cotangent) in the case dtype, parameters / state float32."""
    arrays, cots = _raw_inputs(c)
    keep_f32 = _DELTA_STATE_ARGS if c.op == "delta" else _MIXER_PARAM_ARGS
    act = jnp.dtype(c.dtype)
    prim = [jnp.asarray(x, jnp.float32 if i in keep_f32 else act)
            for i, x in enumerate(arrays)]
    cot = [jnp.asarray(x, act if i == 0 else jnp.float32) for i, x in enumerate(cots)]
    return prim, cot


def _as_float64(xs):
    """The oracle's inputs: exactly the kernel's input values, in float64
    (call inside jax.enable_x64)."""
    return [jnp.asarray(np.asarray(x.astype(jnp.float32), np.float64)) for x in xs]


# --------------------------------------------------------------------------
# jitted (value, vjp) callables, cached per static configuration and mode
# --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _vjp_fn(c_static, impl, mode):
    """jit(primals, cotangents -> (outputs..., grads...)); `mode` (the
    resolved GDN_INTERPRET) is part of the key so a mode change retraces."""
    del mode
    op, chunk, hk, hv, dk, dv = c_static
    if op == "delta":
        def f(q, k, v, g, beta, s0):
            return gk.gated_delta_rule(q, k, v, g, beta, initial_state=s0,
                                       chunk_size=chunk, impl=impl)
    else:
        def f(x, w, a, b, a_log, dt_bias):
            return (gk.gdn_decoupled_conv1d(
                x, w, a, b, a_log, dt_bias, num_k_heads=hk, num_v_heads=hv,
                head_k_dim=dk, head_v_dim=dv, chunk_size=chunk, impl=impl),)

    def run(primals, cotangents):
        outs, vjp = jax.vjp(f, *primals)
        return (*outs, *vjp(tuple(cotangents)))

    return jax.jit(run)


def _static(c: Case):
    return (c.op, c.chunk, c.hk, c.hv, c.dk, c.dv)


_RESULTS: dict = {}


def _run(c: Case, impl: str, tag: str = ""):
    """Outputs and gradients of one case as float64 numpy arrays (cached)."""
    mode = interpret.resolved_mode() if impl == "pallas" else "n/a"
    key = (c, impl, mode, tag)
    if key not in _RESULTS:
        prim, ct = _kernel_inputs(c)
        if impl == "reference":
            with jax.enable_x64(True):
                prim, ct = _as_float64(prim), _as_float64(ct)
                out = _vjp_fn(_static(c), impl, mode)(prim, ct)
                res = [np.asarray(o, np.float64) for o in out]
        else:
            out = _vjp_fn(_static(c), impl, mode)(prim, ct)
            for o, p in zip(out[len(out) - len(prim):], prim):
                assert o.dtype == p.dtype and o.shape == p.shape
            res = [np.asarray(jnp.asarray(o).astype(jnp.float32), np.float64)
                   if o.dtype == jnp.bfloat16 else np.asarray(o) for o in out]
        _RESULTS[key] = res
    return _RESULTS[key]


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / nb) if nb > 0 else float(np.linalg.norm(a - b))


def _check(group, c: Case, got, want, out_tol, grad_tol):
    """Relative L2 per tensor: outputs within out_tol, gradients grad_tol."""
    names = _names(c)
    n_out = 2 if c.op == "delta" else 1
    errors = {}
    for i, (name, a, b) in enumerate(zip(names, got, want)):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert np.all(np.isfinite(a)), f"{c}: non-finite values in {name}"
        errors[name] = _rel(a, b)
        key = (group, name)
        WORST[key] = max(WORST.get(key, 0.0), errors[name])
    bad = {n: e for i, (n, e) in enumerate(errors.items())
           if e > (out_tol if i < n_out else grad_tol)}
    assert not bad, f"{group} {c}: {bad} (all: {errors})"
    return errors


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print("\nworst relative L2 error per (group, tensor):")
    for (group, name), err in sorted(WORST.items()):
        print(f"  {group:22s} {name:14s} {err:.2e}")


@pytest.fixture
def hlo_mode(monkeypatch):
    monkeypatch.setenv(interpret.ENV_VAR, "hlo")


# --------------------------------------------------------------------------
# a. pallas vs float64 oracle
# --------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=str)
def test_pallas_matches_float64_reference(case, hlo_mode):
    tol = (F32_OUT_TOL, F32_GRAD_TOL) if case.dtype == "float32" else (BF16_TOL, BF16_TOL)
    _check(f"a.vs_f64ref.{case.dtype}", case, _run(case, "pallas"),
           _run(case, "reference"), *tol)


@pytest.mark.parametrize("case", [CASES[1], CASES[10]], ids=str)
def test_pallas_float64_matches_reference(case, hlo_mode):
    """float64 inputs run the kernels in float64 (accumulation_dtype): the
    chunked algorithm then equals the token scan to rounding."""
    prim, ct = _kernel_inputs(case)
    with jax.enable_x64(True):
        prim, ct = _as_float64(prim), _as_float64(ct)
        got = _vjp_fn(_static(case), "pallas", interpret.resolved_mode())(prim, ct)
        assert all(x.dtype == jnp.float64 for x in got)
        got = [np.asarray(x) for x in got]
    _check("a.vs_f64ref.float64", case, got, _run(case, "reference"), F64_TOL, F64_TOL)


# --------------------------------------------------------------------------
# b. TPU simulator: uninitialised memory is NaN, OOB reads raise
# --------------------------------------------------------------------------

def test_simulator_case_list():
    assert len(SIM_CASES) >= 10
    assert any(c.t % c.chunk for c in SIM_CASES)
    assert {c.op for c in SIM_CASES} == {"delta", "mixer"}


@pytest.mark.parametrize("case", SIM_CASES, ids=str)
def test_pallas_tpu_simulator(case, monkeypatch):
    monkeypatch.setenv(interpret.ENV_VAR, "tpu-sim")
    assert interpret.resolved_mode() == "tpu-sim"
    try:
        got = _run(case, "pallas")
    except Exception:
        pltpu.reset_tpu_interpret_mode_state()
        raise
    tol = (F32_OUT_TOL, F32_GRAD_TOL) if case.dtype == "float32" else (BF16_TOL, BF16_TOL)
    _check(f"b.tpu_sim.{case.dtype}", case, got, _run(case, "reference"), *tol)


# --------------------------------------------------------------------------
# c. lowering for TPU from this CPU machine
# --------------------------------------------------------------------------

def _lowering_args(op, dtype):
    s = jax.ShapeDtypeStruct
    b, t, hk, hv, dk, dv = 2, 100, 1, 2, 32, 64
    if op == "delta":
        return (s((b, t, hk, dk), dtype), s((b, t, hk, dk), dtype), s((b, t, hv, dv), dtype),
                s((b, t, hv), dtype), s((b, t, hv), dtype), s((b, hv, dk, dv), jnp.float32))
    ch = 2 * hk * dk + hv * dv
    return (s((b, t, ch), dtype), s((4, ch), jnp.float32), s((b, t, hv), dtype),
            s((b, t, hv), dtype), s((hv,), jnp.float32), s((b, hv), jnp.float32))


def _lowering_fn(op, grad):
    if op == "delta":
        def f(q, k, v, g, beta, s0):
            o, s = gk.gated_delta_rule(q, k, v, g, beta, initial_state=s0, chunk_size=32)
            return o, s

        def loss(*args):
            o, s = f(*args)
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s * s)
    else:
        def f(x, w, a, b, a_log, dt_bias):
            return gk.gdn_decoupled_conv1d(x, w, a, b, a_log, dt_bias, num_k_heads=1,
                                           num_v_heads=2, head_k_dim=32, head_v_dim=64,
                                           chunk_size=32)

        def loss(*args):
            return jnp.sum(f(*args).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=tuple(range(6))) if grad else f


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("op", ["delta", "mixer"])
def test_lowers_for_tpu(op, grad, dtype, monkeypatch):
    monkeypatch.setenv(interpret.ENV_VAR, "off")
    text = (jax.jit(_lowering_fn(op, grad))
            .trace(*_lowering_args(op, jnp.dtype(dtype)))
            .lower(lowering_platforms=("tpu",)).as_text())
    calls = re.findall(r"@tpu_custom_call\(", text)
    names = re.findall(r'kernel_name = "(gdn_chunk_\w+)"', text)
    print(f"\n{op} {'grad' if grad else 'fwd'} {dtype}: {len(calls)} tpu_custom_call {names}")
    if grad:
        assert sorted(names) == ["gdn_chunk_backward", "gdn_chunk_forward"]
        assert len(calls) == 2
    else:
        assert names == ["gdn_chunk_forward"]
        assert len(calls) == 1


# --------------------------------------------------------------------------
# d. pallas vs the XLA twin, and determinism
# --------------------------------------------------------------------------

@pytest.mark.parametrize("case", F32_CASES, ids=str)
def test_pallas_matches_xla_twin(case, hlo_mode):
    _check("d.vs_xla", case, _run(case, "pallas"), _run(case, "xla"),
           TWIN_TOL, TWIN_TOL)


@pytest.mark.parametrize("case", [F32_CASES[3], F32_CASES[-1]], ids=str)
@pytest.mark.parametrize("impl", ["pallas", "xla"])
def test_two_runs_bitwise_identical(case, impl, hlo_mode):
    first = _run(case, impl)
    second = _run(case, impl, tag="rerun")
    for name, a, b in zip(_names(case), first, second):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (impl, str(case), name)
