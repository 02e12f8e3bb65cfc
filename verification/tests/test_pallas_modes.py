"""gdn_kernels' own backends in every execution mode, through the suite's
shared runners, cases and tolerance policy (no harness of its own):

  contract  pallas vs the float64 oracle within the contract's acceptance
            bounds (tolerance.DTYPES: float32 1e-5 outputs / 1e-4 gradients,
            bfloat16 2e-2) on the explicit cases (strategies.explicit),
            and float64 inputs through the kernels equal the oracle to 1e-12;
  tpu-sim   GDN_INTERPRET=tpu-sim (TPU memory simulated, out-of-bounds
            reads raise, uninitialised memory is NaN): the gradient-parity
            properties hold on the explicit cases of <= 8 grid steps;
  twin      pallas vs its XLA twin within tolerance.DTYPES[...].twin, and two
            runs of each bitwise identical;
  rows      grid steps over blocks of batch rows and heads: a case split
            into one batch row and one key head a step equals the same case
            in one step (both interpret modes; the simulator raises on an
            out-of-bounds window), and a step's lane windows are legal TPU
            blocks;
  short row a packed mixer row shorter than its conv's history (K = 8,
            T = 6) on pallas and xla, within the contract bounds;
  lowering  GDN_INTERPRET=off: both ops and their gradients lower for TPU
            from this CPU machine, yielding the forward/backward Mosaic kernels.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import gdn_kernels as gk
from gdn_kernels import delta_rule, interpret, pallas_impl, segments
from strategies import explicit, segment_ids_of
from strategies.cases import replace

from ..engine import runners
from ..properties.parity import delta_rule_gradient_parity, mixer_gradient_parity
from ..engine.registry import conclude
from ..targets import Target
from ..tolerance import DTYPES, bounded, compare_self

PALLAS, XLA = Target.parse("gdn_kernels:pallas"), Target.parse("gdn_kernels:xla")
CASES = explicit.DELTA_CASES + explicit.MIXER_CASES + explicit.PACKED_CASES
F32_CASES = tuple(c for c in CASES if c.dtype == "float32")
SIM_MAX_STEPS = 8   # the simulator runs ~2 ms per grid step
SIM_CASES = tuple(c for c in CASES if explicit.grid_steps(c) <= SIM_MAX_STEPS)


def _named(case, out, grads):
    return dict(zip(runners.output_names(case), out)) | {"d" + n: g for n, g in grads.items()}


def _contract_rows(case, got, want, dtype_for):
    rows = []
    for name, value in got.items():
        tol = DTYPES[dtype_for(name)]
        bound = tol.contract_grad if name.startswith("d") else tol.contract_out
        rows.append(bounded(name, value, want[name], bound, np.inf, dtype_for(name)))
    return rows


@pytest.fixture
def hlo_mode(monkeypatch):
    monkeypatch.setenv(interpret.ENV_VAR, "hlo")


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_pallas_meets_contract_bounds(case, hlo_mode):
    inputs = runners.case_inputs(case)
    got = _named(case, *runners.target_vjp(PALLAS, case, inputs))
    want = _named(case, *runners.oracle_vjp(case, inputs))
    # every tensor of a case is bounded by its activation dtype: with
    # bfloat16 activations even the float32 state and its cotangent carry
    # bfloat16 rounding
    conclude("pallas contract bounds", _contract_rows(case, got, want, lambda n: case.dtype))


# A packed row shorter than the conv's history (K-1 > T > 4, so the chunked
# path runs): the conv windows once built K-1 - T too few history slots.
SHORT_ROW_WIDE_CONV = replace(
    explicit.mixer_case("mha-dk<dv", 2, 6, 16, seed=39, param_rank=1,
                        segments=(((1, 2), (2, 4)), ((0, 1), (3, 5)))), conv_width=8)


@pytest.mark.parametrize("target", (PALLAS, XLA), ids=str)
def test_packed_row_shorter_than_conv_history(target, hlo_mode):
    case = SHORT_ROW_WIDE_CONV
    inputs = runners.case_inputs(case)
    got = _named(case, *runners.target_vjp(target, case, inputs))
    want = _named(case, *runners.oracle_vjp(case, inputs))
    conclude("short packed row, wide conv", _contract_rows(case, got, want, lambda n: case.dtype))


@pytest.mark.parametrize("case", (explicit.DELTA_CASES[1], explicit.MIXER_CASES[1]), ids=repr)
def test_pallas_float64_equals_oracle(case, hlo_mode):
    """float64 inputs run the kernels in float64 (accumulation_dtype): the
    chunked algorithm then equals the token scan to rounding."""
    case64 = replace(case, dtype="float64", **({"state_dtype": "float64"} if hasattr(
        case, "state_dtype") else {"param_dtype": "float64"}))
    inputs = {n: x.astype(np.float64) for n, x in runners.case_inputs(case).items()}
    out, grads = runners.run_vjp(runners.target_fn(PALLAS, runners.case_op(case)), case64,
                                 inputs, runners.cotangents(case), x64=True)
    assert all(x.dtype == np.float64 for x in (*out, *grads.values()))
    want = _named(case, *runners.oracle_vjp(case, inputs))
    conclude("pallas float64", _contract_rows(case64, _named(case, out, grads), want,
                                              lambda n: "float64"))


def test_simulator_case_list():
    assert len(SIM_CASES) >= 6
    assert any(c.seq_len % c.chunk for c in SIM_CASES)
    assert {runners.case_op(c) for c in SIM_CASES} == {"delta", "mixer"}


@pytest.mark.parametrize("case", SIM_CASES, ids=repr)
def test_gradient_parity_in_tpu_simulator(case, monkeypatch):
    monkeypatch.setenv(interpret.ENV_VAR, "tpu-sim")
    assert interpret.resolved_mode() == "tpu-sim"
    check = delta_rule_gradient_parity if runners.case_op(case) == "delta" else \
        mixer_gradient_parity
    try:
        conclude("gradient parity (tpu-sim)", check(PALLAS, case))
    except Exception:
        pltpu.reset_tpu_interpret_mode_state()
        raise


@pytest.mark.parametrize("case", F32_CASES, ids=repr)
def test_pallas_matches_xla_twin(case, hlo_mode):
    inputs = runners.case_inputs(case)
    pallas = _named(case, *runners.target_vjp(PALLAS, case, inputs))
    xla = _named(case, *runners.target_vjp(XLA, case, inputs))
    tol = DTYPES["float32"].twin
    conclude("pallas vs xla", [bounded(n, pallas[n], xla[n], tol, tol * max(
        1.0, float(np.max(np.abs(xla[n])))), "float32") for n in pallas])


@pytest.mark.parametrize("case", (F32_CASES[3], F32_CASES[-1]), ids=repr)
@pytest.mark.parametrize("target", (PALLAS, XLA), ids=str)
def test_two_runs_bitwise_identical(case, target, hlo_mode):
    first = _named(case, *runners.target_vjp(target, case))
    second = _named(case, *runners.target_vjp(target, case))
    conclude("bitwise repeat", [compare_self(n, first[n], second[n], "float32", exact=True)
                                for n in first])


# --------------------------------------------------------------------------
# grid steps over blocks of batch rows and heads
# --------------------------------------------------------------------------

ROWS_CASE = explicit.delta_case("bench-d128", 2, 37, 16, seed=13)   # G 2, Hv 4, D 128
# name -> (case, [Dk, Dv] states a step may hold, the (Bb, Hb) that budget gives)
ROW_SPLITS = {
    "1-batch-row-1-key-head": (ROWS_CASE, 2, (1, 2)),
    "packed": (replace(ROWS_CASE, segments=explicit.PACKED_T37), 2, (1, 2)),
    "2-batch-rows-1-of-3-key-heads": (replace(ROWS_CASE, k_heads=3), 4, (2, 2)),
}


def _backend_vjp(case, mode: str, state_bytes: int):
    """The pallas backend through delta_rule's custom VJP (its padding
    handling included) on the case's inputs and random cotangents, in
    interpret mode `mode` with grid steps of at most `state_bytes` of
    states (KernelSettings). Returns name -> array."""
    inputs = runners.case_inputs(case)
    primals = tuple(jnp.asarray(inputs[n]) for n in
                    ("q", "k", "v", "g", "beta", "initial_state"))
    ids = segment_ids_of(case)
    rng = np.random.default_rng(case.seed)
    cotangents = tuple(jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
                       for x in (primals[2], primals[5]))
    cfg = delta_rule.DeltaRuleConfig(impl="pallas", scale=case.dk ** -0.5,
                                     chunk_size=case.chunk, interpret=mode,
                                     state_bytes_per_step=state_bytes)

    def run(primals, cotangents, ids):
        seg = None if ids is None else segments.from_ids(ids)
        out, vjp = jax.vjp(lambda *p: delta_rule.chunked_delta_rule(cfg, *p, seg), *primals)
        return out + vjp(cotangents)

    out = jax.jit(run)(primals, cotangents, None if ids is None else jnp.asarray(ids))
    names = ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "ds0")
    return dict(zip(names, (np.asarray(x) for x in out)))


@pytest.mark.parametrize("mode", ["hlo", "tpu-sim"])
@pytest.mark.parametrize("split", ROW_SPLITS)
def test_row_blocks_equal_one_block(split, mode):
    """Under a budget of a few [Dk, Dv] states a step, every grid step takes
    a block of batch rows and whole key heads (their value heads) at its own
    batch offset and lane offset: outputs and cotangents equal the one-step
    run to float32 rounding (packed rows too: the scalars' head offset)."""
    case, states, block = ROW_SPLITS[split]
    dims = (case.batch, case.v_heads, case.group, case.dk, case.dv, 4)
    state_bytes = case.dk * case.dv * 4
    whole = case.batch * case.v_heads * state_bytes
    assert pallas_impl.step_block(*dims, whole) == (case.batch, case.v_heads)
    one_block = _backend_vjp(case, interpret.resolved_mode(), whole)
    assert pallas_impl.step_block(*dims, states * state_bytes) == block
    try:
        blocks = _backend_vjp(case, mode, states * state_bytes)
    except Exception:
        pltpu.reset_tpu_interpret_mode_state()
        raise
    conclude("row blocks vs one block", [compare_self(n, blocks[n], one_block[n], "float32")
                                         for n in one_block])


@pytest.mark.parametrize("dk, dv, want", [
    (128, 128, (1, 2)),   # one key head: 128 lanes of q and k, 256 of v
    (128, 64, (1, 2)),    # 128 of q and k, 128 of v
    (64, 128, (1, 4)),    # 64 lanes of q and k: only the whole width is legal
    (32, 64, (1, 4)),
])
def test_step_block_windows_are_legal_tpu_blocks(dk, dv, want):
    """Under a budget of G states (B 2, Hv 4, G 2) a step takes one key head
    only where its lane windows are a multiple of 128 lanes; otherwise all
    heads (the whole width is always legal), over the budget."""
    assert pallas_impl.step_block(2, 4, 2, dk, dv, 4, 2 * dk * dv * 4) == want


# --------------------------------------------------------------------------
# lowering for TPU from this CPU machine
# --------------------------------------------------------------------------

def _lowering_args(op, dtype, packed):
    s = jax.ShapeDtypeStruct
    b, t, hk, hv, dk, dv = 2, 100, 1, 2, 32, 64
    ids = (s((b, t), jnp.int32),) if packed else (None,)
    if op == "delta":
        return (s((b, t, hk, dk), dtype), s((b, t, hk, dk), dtype), s((b, t, hv, dv), dtype),
                s((b, t, hv), dtype), s((b, t, hv), dtype), s((b, hv, dk, dv), jnp.float32)
                ) + ids
    ch = 2 * hk * dk + hv * dv
    return (s((b, t, ch), dtype), s((4, ch), jnp.float32), s((b, t, hv), dtype),
            s((b, t, hv), dtype), s((hv,), jnp.float32), s((b, hv), jnp.float32)) + ids


def _lowering_fn(op, grad, ops=gk):
    """The op (or its gradient) through `ops`: gdn_kernels, or its sharded ops."""
    if op == "delta":
        def f(q, k, v, g, beta, s0, ids):
            return ops.gated_delta_rule(q, k, v, g, beta, initial_state=s0, segment_ids=ids,
                                       chunk_size=32)

        def loss(*args):
            o, s = f(*args)
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s * s)
    else:
        def f(x, w, a, b, a_log, dt_bias, ids):
            return ops.gdn_decoupled_conv1d(x, w, a, b, a_log, dt_bias, num_k_heads=1,
                                           num_v_heads=2, head_k_dim=32, head_v_dim=64,
                                           segment_ids=ids, chunk_size=32)

        def loss(*args):
            return jnp.sum(f(*args).astype(jnp.float32) ** 2)
    return jax.grad(loss, argnums=tuple(range(6))) if grad else f


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("op", ["delta", "mixer"])
def test_lowers_for_tpu(op, grad, dtype, packed, monkeypatch):
    """Packed rows add the doc / start streams to both kernels (the conv's
    compaction is plain XLA outside them)."""
    monkeypatch.setenv(interpret.ENV_VAR, "off")
    text = (jax.jit(_lowering_fn(op, grad))
            .trace(*_lowering_args(op, jnp.dtype(dtype), packed))
            .lower(lowering_platforms=("tpu",)).as_text())
    calls = re.findall(r"@tpu_custom_call\(", text)
    names = re.findall(r'kernel_name = "(gdn_chunk_\w+)"', text)
    if grad:
        assert sorted(names) == ["gdn_chunk_backward", "gdn_chunk_forward"]
        assert len(calls) == 2
    else:
        assert names == ["gdn_chunk_forward"]
        assert len(calls) == 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_blocks_lower_for_tpu(dtype):
    """Grid steps over one batch row and one key head (lane windows of 128
    and 256 lanes at their offsets, B 2, Hk 2, Hv 4, D 128: a budget of two
    states a step): both kernels lower for TPU."""
    b, t, hk, hv, d = 2, 100, 2, 4, 128
    budget = 2 * d * d * 4
    assert pallas_impl.step_block(b, hv, hv // hk, d, d, 4, budget) == (1, 2)
    cfg = delta_rule.DeltaRuleConfig(impl="pallas", scale=d ** -0.5, chunk_size=32,
                                     interpret="off", state_bytes_per_step=budget)

    def loss(*args):
        o, s_final = delta_rule.chunked_delta_rule(cfg, *args)
        return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s_final * s_final)

    s, dt = jax.ShapeDtypeStruct, jnp.dtype(dtype)
    args = (s((b, t, hk, d), dt), s((b, t, hk, d), dt), s((b, t, hv, d), dt),
            s((b, t, hv), dt), s((b, t, hv), dt), s((b, hv, d, d), jnp.float32))
    text = (jax.jit(jax.grad(loss, argnums=tuple(range(6)))).trace(*args)
            .lower(lowering_platforms=("tpu",)).as_text())
    names = re.findall(r'kernel_name = "(gdn_chunk_\w+)"', text)
    assert sorted(names) == ["gdn_chunk_backward", "gdn_chunk_forward"]


@pytest.mark.parametrize("op", ["delta", "mixer"])
def test_sharded_ops_lower_for_tpu(op, monkeypatch):
    """Under jax.shard_map (check_vma on) the Pallas kernels declare their
    outputs' varying axes and still lower for TPU, forward and backward (a
    (1, 1) mesh: the same typing as any mesh, on this process's one device)."""
    monkeypatch.setenv(interpret.ENV_VAR, "off")
    mesh = jax.make_mesh((1, 1), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    ops = gk.sharded(mesh, batch_axis="data", head_axis="model")
    text = (jax.jit(_lowering_fn(op, True, ops))
            .trace(*_lowering_args(op, jnp.dtype("float32"), True))
            .lower(lowering_platforms=("tpu",)).as_text())
    names = re.findall(r'kernel_name = "(gdn_chunk_\w+)"', text)
    assert sorted(names) == ["gdn_chunk_backward", "gdn_chunk_forward"]


@pytest.mark.parametrize("seq_len", [100, 1], ids=["prefill", "decode"])
def test_mixer_with_carried_state_lowers_for_tpu(seq_len, monkeypatch):
    """The mixer's gradient through an incoming GDNState (and a cotangent
    on the returned one) lowers for TPU: a prefill call through both Pallas
    kernels, a decode call (T = 1, the recurrent path) through none."""
    monkeypatch.setenv(interpret.ENV_VAR, "off")
    s = jax.ShapeDtypeStruct
    b, hk, hv, dk, dv, width = 2, 1, 2, 32, 64, 4
    ch = 2 * hk * dk + hv * dv
    args = (s((b, seq_len, ch), jnp.bfloat16), s((width, ch), jnp.float32),
            s((b, seq_len, hv), jnp.bfloat16), s((b, seq_len, hv), jnp.bfloat16),
            s((hv,), jnp.float32), s((b, hv), jnp.float32),
            gk.GDNState(s((b, width - 1, ch), jnp.bfloat16), s((b, hv, dk, dv), jnp.float32)))

    def loss(x, w, a, bb, a_log, dt_bias, state):
        o, new = gk.gdn_decoupled_conv1d(x, w, a, bb, a_log, dt_bias, num_k_heads=hk,
                                         num_v_heads=hv, head_k_dim=dk, head_v_dim=dv,
                                         chunk_size=32, state=state, return_state=True)
        return (jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(new.recurrent ** 2)
                + jnp.sum(new.conv.astype(jnp.float32)))

    text = (jax.jit(jax.grad(loss, argnums=(0, 6))).trace(*args)
            .lower(lowering_platforms=("tpu",)).as_text())
    names = re.findall(r'kernel_name = "(gdn_chunk_\w+)"', text)
    expected = ["gdn_chunk_backward", "gdn_chunk_forward"] if seq_len > 4 else []
    assert sorted(names) == expected
