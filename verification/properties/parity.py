"""Parity with the float64 oracle: outputs, final state and every gradient
of both ops (the token scan with plain autodiff, gdn_kernels.reference)."""

from __future__ import annotations

import dataclasses

from strategies import delta_rule_cases, mixer_cases
from strategies.inputs import chunk_geometry, closest_key_pair, deepest_chunk_log_decay
from strategies.cases import DeltaRuleCase, MixerCase

from ..engine.registry import prop, shape_claim
from .common import (BFLOAT16, CHUNK_128, GVA, ONE_PAST_A_CHUNK, ONE_TOKEN, OTHER_SCALE,
                     PER_BATCH_A_LOG, parity_rows)

# Regressions found by this suite (docs/kernel-authors.md, "Findings").
STRONG_DECAY_T15 = DeltaRuleCase(batch=1, seq_len=15, k_heads=1, group=1, dk=16, dv=16,
                                 chunk=16, dtype="float32", state_dtype="float32", seed=0,
                                 has_initial_state=False, gate_regime="strong_decay")
LARGE_A_LOG_T15 = dataclasses.replace(STRONG_DECAY_T15, gate_regime="large_a_log")
# One nearly full chunk of 128 (lattice.DELTA_FIELD_CHUNK_ROWS' first row):
# near-repeated keys, beta one, no decay: the chunk matrix's powers are as
# large as they get, so an inverse that is exact only up to 64 rows (a power
# series truncated there) is caught in every profile.
REPEATED_KEYS_C128 = dataclasses.replace(
    STRONG_DECAY_T15, seq_len=127, chunk=128, has_initial_state=True, gate_regime="no_decay",
    beta_regime="one", key_cosine=0.99, seed=5)
MIXER_LARGE_A_LOG_T15 = MixerCase(batch=2, seq_len=15, k_heads=1, group=1, dk=16, dv=16,
                                  chunk=16, conv_width=4, dtype="float32",
                                  param_dtype="float32", a_log_shape=(1,), dt_bias_shape=(1,),
                                  seed=1, gate_regime="large_a_log")
# A float32 row across three chunk boundaries under ordinary gates: the state
# carried between chunks weighs on every output after the first chunk. The
# kill profile's drawn kills of a state kept in bfloat16 (state_in_bf16) and
# of a backward streaming its chunks in forward order
# (pallas_bwd_reads_chunks_forward) came on cases where that state had
# decayed away, at 5.0 and 4.7 times the bound; on this row they are 219 and
# 2.7e5 times it (gdn_kernels: 0.03 and 0.08), under any compile setting
# (verification/tests/test_kill_settings.py).
MIXER_THREE_CHUNKS_T53 = MixerCase(batch=1, seq_len=53, k_heads=1, group=2, dk=16, dv=24,
                                   chunk=16, conv_width=4, dtype="float32",
                                   param_dtype="float32", a_log_shape=(2,), dt_bias_shape=(2,),
                                   seed=7)

DELTA_COVERS = {
    "T=1": ONE_TOKEN,
    "T=C+1": ONE_PAST_A_CHUNK,
    "GVA": GVA,
    "Dk!=Dv": shape_claim(lambda c: c.dk != c.dv),
    "bfloat16": BFLOAT16,
    "strong decay": lambda c: c.gate_regime == "strong_decay",
    "beta ~ 0": lambda c: c.beta_regime == "zero",
    "zero q/k row": lambda c: bool(c.zero_rows),
    "initial state": shape_claim(lambda c: c.has_initial_state, "initial_state"),
    "C=128": CHUNK_128,
    "scale= other than Dk**-0.5": OTHER_SCALE,
    # the keys' geometry, measured on the inputs (cheap cases tried first)
    "mean in-chunk key cosine >= 0.9": lambda c: (c.key_cosine >= 0.9 and c.seq_len >= 16
                                                  and chunk_geometry(c)[0] >= 0.9),
    "chunk matrix condition >= 50": lambda c: (c.key_cosine >= 0.5 and c.seq_len >= 16
                                               and chunk_geometry(c)[1] >= 50),
    "repeated keys (in-chunk cosine >= 0.999), beta ~ 1, no decay": lambda c: (
        c.key_cosine == 1.0 and c.beta_regime == "one" and c.gate_regime == "no_decay"
        and c.seq_len >= 16 and chunk_geometry(c)[0] >= 0.999),
    "near-parallel key pair (cosine >= 0.99), independent keys": lambda c: (
        c.key_pair_cosine and not c.key_cosine and c.seq_len >= 2
        and closest_key_pair(c) >= 0.99),
    # overflow of exp(G_i - G_j) on a chunk's masked half, with a state coming in
    "in-chunk log-decay < -1000, initial state": lambda c: (
        c.has_initial_state and c.gate_regime != "no_decay"
        and deepest_chunk_log_decay(c) < -1000.0),
}
MIXER_COVERS = {
    "T=1": ONE_TOKEN,
    "GVA": GVA,
    "bfloat16 params": shape_claim(lambda c: c.param_dtype == "bfloat16"),
    "[B,Hv] a_log": PER_BATCH_A_LOG,
    "[B,T,Hv] dt_bias": shape_claim(lambda c: len(c.dt_bias_shape) == 3 and c.dt_bias_shape[:2] == (
        c.batch, c.seq_len) and c.batch > 1 and c.seq_len > 1),
    "strong decay": lambda c: c.gate_regime == "strong_decay",
    "large a_log": lambda c: c.gate_regime == "large_a_log",
    "no qk norm": shape_claim(lambda c: not c.use_qk_norm, "qk_norm:off"),
    "near-zero row": lambda c: bool(c.near_zero),
    "C=128": CHUNK_128,
    "scale= other than Dk**-0.5": OTHER_SCALE,
}


# Reached only in the ci / kill / nightly lattice covering (strategies.lattice.LONG),
# by the two forward-parity properties: a decay sum or a state kept in bfloat16
# drifts along the row, in o and the final state (the gradients' long rows
# would cost the gate two more compiles of the long VJP programs per property).
LONG_ROW_COVERS = {
    "bfloat16 row of >= 1024 tokens": shape_claim(lambda c: c.dtype == "bfloat16"
                                                  and c.seq_len >= 1024),
}


@prop("mixer_forward_parity", family="parity", strategy=mixer_cases(long_rows=True),
      wrong_target="gdn_mutant_beta_applied_twice:xla", examples=(MIXER_THREE_CHUNKS_T53,),
      covers=MIXER_COVERS, gate_covers=LONG_ROW_COVERS)
def mixer_forward_parity(target, case: MixerCase):
    """gdn_decoupled_conv1d output matches the float64 oracle."""
    return parity_rows(target, case, with_grads=False)


@prop("delta_rule_forward_parity", family="parity", strategy=delta_rule_cases(long_rows=True),
      wrong_target="gdn_mutant_no_decay_between_chunks:xla",
      examples=(STRONG_DECAY_T15, LARGE_A_LOG_T15, REPEATED_KEYS_C128), covers=DELTA_COVERS,
      gate_covers=LONG_ROW_COVERS)
def delta_rule_forward_parity(target, case: DeltaRuleCase):
    """gated_delta_rule output and final state match the float64 oracle."""
    return parity_rows(target, case, with_grads=False)


@prop("mixer_gradient_parity", family="parity", strategy=mixer_cases(),
      wrong_target="gdn_mutant_conv_bwd_shift_by_one:xla",
      examples=(MIXER_LARGE_A_LOG_T15, MIXER_THREE_CHUNKS_T53), covers=MIXER_COVERS,
      on_sharded_target=True)
def mixer_gradient_parity(target, case: MixerCase):
    """Every cotangent of gdn_decoupled_conv1d (x, conv_weight, a, b, a_log,
    dt_bias) matches jax.vjp of the float64 oracle."""
    return parity_rows(target, case, with_grads=True)


@prop("delta_rule_gradient_parity", family="parity", strategy=delta_rule_cases(),
      wrong_target="gdn_mutant_dinitial_state_dropped:xla",
      examples=(STRONG_DECAY_T15, LARGE_A_LOG_T15), covers=DELTA_COVERS,
      on_sharded_target=True)
def delta_rule_gradient_parity(target, case: DeltaRuleCase):
    """Every cotangent of gated_delta_rule (q, k, v, g, beta, initial_state),
    with a random cotangent on o AND on final_state, matches the oracle."""
    return parity_rows(target, case, with_grads=True)
