"""Properties 1-2: forward and gradient parity with the float64 oracle."""

import dataclasses

from hypothesis import example, given

from strategies import DeltaRuleCase, MixerCase

from .harness import check_property, examples
from .suite import SUITE

# Regressions found by this suite, pinned (README "Findings").
STRONG_DECAY_T15 = DeltaRuleCase(batch=1, seq_len=15, k_heads=1, group=1, dk=16, dv=16,
                                 chunk=16, dtype="float32", state_dtype="float32", seed=0,
                                 has_initial_state=False, gate_regime="strong_decay")
LARGE_A_LOG_T15 = dataclasses.replace(STRONG_DECAY_T15, gate_regime="large_a_log")
MIXER_LARGE_A_LOG_T15 = MixerCase(batch=2, seq_len=15, k_heads=1, group=1, dk=16, dv=16,
                                  chunk=16, conv_width=4, dtype="float32",
                                  param_dtype="float32", a_log_shape=(1,), dt_bias_shape=(1,),
                                  seed=1, gate_regime="large_a_log")


@examples(SUITE["mixer_forward_parity"].weight)
@given(case=SUITE["mixer_forward_parity"].strategy)
def test_mixer_forward_matches_float64_oracle(gdn_target, case):
    check_property("mixer_forward_parity", gdn_target, case)


@examples(SUITE["delta_rule_forward_parity"].weight)
@given(case=SUITE["delta_rule_forward_parity"].strategy)
@example(case=STRONG_DECAY_T15)
@example(case=LARGE_A_LOG_T15)
def test_delta_rule_forward_and_final_state_match_float64_oracle(gdn_target, case):
    check_property("delta_rule_forward_parity", gdn_target, case)


@examples(SUITE["mixer_gradient_parity"].weight)
@given(case=SUITE["mixer_gradient_parity"].strategy)
@example(case=MIXER_LARGE_A_LOG_T15)
def test_mixer_every_gradient_matches_float64_oracle(gdn_target, case):
    check_property("mixer_gradient_parity", gdn_target, case)


@examples(SUITE["delta_rule_gradient_parity"].weight)
@given(case=SUITE["delta_rule_gradient_parity"].strategy)
@example(case=STRONG_DECAY_T15)
@example(case=LARGE_A_LOG_T15)
def test_delta_rule_every_gradient_matches_float64_oracle(gdn_target, case):
    check_property("delta_rule_gradient_parity", gdn_target, case)
