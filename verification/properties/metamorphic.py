"""Chunk-boundary and metamorphic relations: the chunk size is invisible,
a split run with the carried state equals one pass, appending tokens never
changes earlier outputs, batch rows are independent, GVA equals an explicit
repeat of the key heads, and two runs are bitwise identical."""

from __future__ import annotations

import numpy as np

from strategies import delta_rule_cases, mixer_cases
from strategies.cases import DeltaRuleCase, MixerCase, replace

from ..engine import runners
from ..engine.registry import prop, shape_claim
from ..tolerance import compare_self
from .common import BFLOAT16, ONE_PAST_A_CHUNK, ONE_TOKEN, dtype_of


def _f32(geo) -> bool:
    return geo["dtypes"] == ("float32", "float32")


LENGTH_COVERS = {
    "T=1": ONE_TOKEN,
    "T=C+1": ONE_PAST_A_CHUNK,
    "T=3C+5": shape_claim(lambda c: c.seq_len == 3 * c.chunk + 5),
}


@prop("chunk_size_invariance", family="metamorphic",
      strategy=delta_rule_cases(where=lambda g: _f32(g) and g["chunk"] == 16), weight=0.5,
      wrong_target="gdn_mutant_inverse_offdiag_block_sign:xla", covers=LENGTH_COVERS,
      needs=("chunk_size:32", "chunk_size:64", "chunk_argument"))
def chunk_size_invariance(target, case: DeltaRuleCase):
    """gated_delta_rule gives the same outputs and gradients for chunk sizes
    16, 32 and 64 (the chunking is an implementation detail)."""
    inputs = runners.case_inputs(case)
    base_out, base_grads = runners.target_vjp(target, replace(case, chunk=16), inputs)
    rows = []
    for chunk in (32, 64):
        out, grads = runners.target_vjp(target, replace(case, chunk=chunk), inputs)
        for n, a, b in zip(runners.output_names(case), out, base_out):
            rows.append(compare_self(f"{n} C={chunk} vs 16", a, b, dtype_of(case, n)))
        for n in inputs:
            rows.append(compare_self(f"d{n} C={chunk} vs 16", grads[n], base_grads[n],
                                     dtype_of(case, n)))
    return rows


def _slice_time(inputs, start, stop):
    return {n: (x if n == "initial_state" else x[:, start:stop]) for n, x in inputs.items()}


@prop("split_invariance", family="metamorphic", strategy=delta_rule_cases(where=_f32),
      wrong_target="gdn_mutant_tail_padded_with_edge_tokens:xla", needs=("initial_state",),
      covers={**LENGTH_COVERS, "no initial state": lambda c: not c.has_initial_state})
def split_invariance(target, case: DeltaRuleCase):
    """Running tokens [0:t] then [t:T] with the carried final state equals one
    pass over [0:T] (outputs and final state), for a drawn split point t."""
    if case.seq_len < 2:
        return []
    inputs = runners.case_inputs(case)
    split = 1 + case.seed % (case.seq_len - 1)
    full_out = runners.target_forward(target, case, inputs)
    first = runners.target_forward(target, replace(case, seq_len=split),
                                   _slice_time(inputs, 0, split))
    second_inputs = _slice_time(inputs, split, case.seq_len)
    second_inputs["initial_state"] = first[1]
    second_case = replace(case, seq_len=case.seq_len - split, state_dtype="float32",
                          has_initial_state=True)
    second = runners.target_forward(target, second_case, second_inputs)
    joined = np.concatenate([first[0], second[0]], axis=1)
    return [compare_self(f"o (split at {split})", joined, full_out[0], case.dtype),
            compare_self("final_state", second[1], full_out[1], "float32")]


def _lengthened(shape, seq_len, extra):
    """A [B', T, Hv] parameter shape grows with T; every other shape stays."""
    if len(shape) == 3 and shape[1] == seq_len and seq_len > 1:
        return (shape[0], seq_len + extra, shape[2])
    return shape


@prop("causality", family="metamorphic", strategy=mixer_cases(where=_f32), weight=0.5,
      wrong_target="gdn_mutant_conv_forward_looks_ahead:xla", covers=LENGTH_COVERS)
def causality(target, case: MixerCase):
    """Appending tokens never changes earlier outputs of gdn_decoupled_conv1d
    (half a chunk and one, across a chunk edge; a whole chunk where the
    target's declared limits take whole chunks only)."""
    inputs = runners.case_inputs(case)
    longer = [_appended(case, extra) for extra in (case.chunk // 2 + 1, case.chunk)]
    longer = next((c for c in longer if not target.declaration.limits.refuses_case(c)),
                  longer[0])
    more = runners.case_inputs(longer)
    ext = {}
    for n, x in inputs.items():   # same prefix, fresh suffix on every time axis
        grows = n in ("x", "a", "b") or (n in ("a_log", "dt_bias") and
                                         more[n].shape != x.shape)
        ext[n] = np.concatenate([x, more[n][:, case.seq_len:]], axis=1) if grows else x
    short_out = runners.target_forward(target, case, inputs)[0]
    long_out = runners.target_forward(target, longer, ext)[0][:, :case.seq_len]
    return [compare_self("o prefix", long_out, short_out, case.dtype)]


def _appended(case: MixerCase, extra: int) -> MixerCase:
    """The case with `extra` tokens appended (time-axis parameters too)."""
    return replace(case, seq_len=case.seq_len + extra,
                   a_log_shape=_lengthened(case.a_log_shape, case.seq_len, extra),
                   dt_bias_shape=_lengthened(case.dt_bias_shape, case.seq_len, extra))


def _rebatch(shape, batch):
    return shape if len(shape) == 1 or shape[0] == 1 else (batch,) + tuple(shape[1:])


def _has_batch(name, x, batch) -> bool:
    if name == "conv_weight":
        return False
    if name in ("a_log", "dt_bias"):
        return x.ndim >= 2 and x.shape[0] == batch and batch > 1
    return True


@prop("batch_independence", family="metamorphic", strategy=mixer_cases(where=_f32),
      weight=0.5, wrong_target="gdn_mutant_l2norm_sums_over_batch:xla",
      covers={"batch 1 (made 2)": lambda c: c.batch == 1, "batch 2": lambda c: c.batch == 2})
def batch_independence(target, case: MixerCase):
    """Each batch row of gdn_decoupled_conv1d equals the op run on that row
    alone (no mixing across the batch axis)."""
    if case.batch < 2:
        case = replace(case, batch=2, a_log_shape=_rebatch(case.a_log_shape, 2),
                       dt_bias_shape=_rebatch(case.dt_bias_shape, 2),
                       near_zero=tuple(r for r in case.near_zero if r.batch == 0))
    inputs = runners.case_inputs(case)
    out = runners.target_forward(target, case, inputs)[0]
    row = case.seed % case.batch
    one = {n: (x[row:row + 1] if _has_batch(n, x, case.batch) else x) for n, x in inputs.items()}
    one_case = replace(case, batch=1, a_log_shape=one["a_log"].shape,
                       dt_bias_shape=one["dt_bias"].shape)
    alone = runners.target_forward(target, one_case, one)[0]
    return [compare_self(f"o[row {row}]", alone[0], out[row], case.dtype)]


@prop("gva_equals_explicit_repeat", family="metamorphic",
      strategy=delta_rule_cases(where=lambda g: _f32(g) and g["layout"][1] > 1), weight=0.5,
      wrong_target="gdn_mutant_gva_tile_not_repeat:xla", needs=("gva", "kernel_gva"),
      covers={"G=2": shape_claim(lambda c: c.group == 2, "gva"),
              "G=4": shape_claim(lambda c: c.group == 4, "gva"),
              "Hk=2": lambda c: c.k_heads == 2})
def gva_equals_explicit_repeat(target, case: DeltaRuleCase):
    """GVA: q, k at Hk heads give the same output as q, k repeated G times
    (jnp.repeat on the head axis) with Hk = Hv; dq, dk equal the repeated
    run's cotangents summed over each group."""
    if case.group == 1:
        case = replace(case, group=2)
    inputs = runners.case_inputs(case)
    out, grads = runners.target_vjp(target, case, inputs)
    rep = dict(inputs)
    rep["q"] = np.repeat(inputs["q"], case.group, axis=2)
    rep["k"] = np.repeat(inputs["k"], case.group, axis=2)
    rep_case = replace(case, k_heads=case.v_heads, group=1)
    r_out, r_grads = runners.target_vjp(target, rep_case, rep)
    rows = [compare_self(n, a, b, dtype_of(case, n))
            for n, a, b in zip(runners.output_names(case), out, r_out)]
    for n in ("q", "k"):
        b, t, hk, d = inputs[n].shape
        summed = r_grads[n].astype(np.float64).reshape(b, t, hk, case.group, d).sum(axis=3)
        rows.append(compare_self("d" + n, grads[n], summed, case.dtype))
    for n in ("v", "g", "beta"):
        rows.append(compare_self("d" + n, grads[n], r_grads[n], case.dtype))
    return rows


@prop("determinism", family="metamorphic", strategy=mixer_cases(), weight=0.5,
      wrong_target="verification.fixture_kernels.wrong_targets.nondeterministic",
      covers={"bfloat16": BFLOAT16})
def determinism(target, case: MixerCase):
    """Two runs of gdn_decoupled_conv1d (output and every cotangent) are
    bitwise identical."""
    inputs = runners.case_inputs(case)
    out1, g1 = runners.target_vjp(target, case, inputs)
    out2, g2 = runners.target_vjp(target, case, inputs)
    rows = [compare_self("o", out1[0], out2[0], case.dtype, exact=True)]
    rows += [compare_self("d" + n, g1[n], g2[n], case.dtype, exact=True) for n in inputs]
    return rows
