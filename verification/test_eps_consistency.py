"""Property 3: forward/backward eps consistency of the QK L2 norm."""

from hypothesis import given

from strategies import mixer_cases

from .harness import check_property, examples

WITH_NORM = dict(where=lambda geo: geo["qk_norm"])


@examples(1)
@given(case=mixer_cases(near_zero=True, eps_values=(1e-6, 1e-5, 1e-8), **WITH_NORM))
def test_near_zero_qk_rows_vjp_equals_oracle_vjp_at_same_eps(gdn_target, case):
    check_property("near_zero_rows_vjp_parity", gdn_target, case)


@examples(0.5)
@given(case=mixer_cases(near_zero=True, where=lambda geo: geo["qk_norm"] and geo["length"] in ("1", "C-1", "C+1")))
def test_vjp_matches_finite_differences_of_own_forward(gdn_target, case):
    check_property("vjp_matches_finite_differences", gdn_target, case)


@examples(4)
@given(case=mixer_cases(eps_values=(1e-6, 1e-5, 1e-8)))
def test_l2norm_is_invariant_under_x_to_cx_eps_to_c2eps(gdn_target, case):
    check_property("l2norm_scale_invariance", gdn_target, case)
