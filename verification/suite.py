"""The suite's table: for each property, the strategy its test draws from
and the weight of its example budget. The test files, the wrong-target
meta-test and the mutation runner all read this one table."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from strategies import delta_rule_cases, mixer_cases


def _f32(geo) -> bool:
    return geo["dtypes"] == ("float32", "float32")


@dataclasses.dataclass(frozen=True)
class Entry:
    strategy: st.SearchStrategy
    weight: float
    test: str


_NEAR_ZERO_EPS = (1e-6, 1e-5, 1e-8)

SUITE = {
    "mixer_forward_parity": Entry(mixer_cases(), 1, "test_mixer_forward_matches_float64_oracle"),
    "delta_rule_forward_parity": Entry(
        delta_rule_cases(), 1, "test_delta_rule_forward_and_final_state_match_float64_oracle"),
    "mixer_gradient_parity": Entry(mixer_cases(), 1, "test_mixer_every_gradient_matches_float64_oracle"),
    "delta_rule_gradient_parity": Entry(
        delta_rule_cases(), 1, "test_delta_rule_every_gradient_matches_float64_oracle"),
    "near_zero_rows_vjp_parity": Entry(
        mixer_cases(near_zero=True, eps_values=_NEAR_ZERO_EPS, where=lambda g: g["qk_norm"]),
        1, "test_near_zero_qk_rows_vjp_equals_oracle_vjp_at_same_eps"),
    "vjp_matches_finite_differences": Entry(
        mixer_cases(near_zero=True, where=lambda g: g["qk_norm"] and g["length"] in ("1", "C-1", "C+1")),
        0.5, "test_vjp_matches_finite_differences_of_own_forward"),
    "l2norm_scale_invariance": Entry(
        mixer_cases(eps_values=_NEAR_ZERO_EPS), 4,
        "test_l2norm_is_invariant_under_x_to_cx_eps_to_c2eps"),
    "cotangent_shapes_and_dtypes": Entry(
        mixer_cases(), 4, "test_every_cotangent_has_its_primal_shape_and_dtype"),
    "param_gradient_is_broadcast_sum": Entry(
        mixer_cases(where=lambda g: g["a_log"] != "[B,T,Hv]" or g["dt_bias"] != "[B,T,Hv]"),
        0.5, "test_param_gradient_equals_sum_of_broadcast_gradient"),
    "chunk_size_invariance": Entry(
        delta_rule_cases(where=lambda g: _f32(g) and g["chunk"] == 16), 0.5,
        "test_chunk_sizes_16_32_64_agree"),
    "split_invariance": Entry(delta_rule_cases(where=_f32), 1,
                              "test_split_run_with_carried_state_equals_one_pass"),
    "causality": Entry(mixer_cases(where=_f32), 0.5,
                       "test_appending_tokens_never_changes_earlier_outputs"),
    "batch_independence": Entry(mixer_cases(where=_f32), 0.5, "test_batch_rows_are_independent"),
    "gva_equals_explicit_repeat": Entry(
        delta_rule_cases(where=lambda g: _f32(g) and g["layout"][1] > 1), 0.5,
        "test_gva_equals_explicit_repeat_of_key_heads"),
    "determinism": Entry(mixer_cases(), 0.5, "test_two_runs_are_bitwise_identical"),
    "unstable_no_spurious_nan": Entry(
        delta_rule_cases(stable=False, where=_f32), 0.5,
        "test_unstable_recurrence_has_no_nan_where_oracle_is_finite"),
    "bad_input_raises_named_error": Entry(
        mixer_cases(near_zero=False), 4, "test_generated_contract_violations_raise_named_errors"),
}
