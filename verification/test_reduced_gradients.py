"""Property 4: shape preservation of reduced (a_log / dt_bias) gradients."""

from hypothesis import given

from strategies import mixer_cases

from .harness import check_property, examples


@examples(4)
@given(case=mixer_cases())
def test_every_cotangent_has_its_primal_shape_and_dtype(gdn_target, case):
    check_property("cotangent_shapes_and_dtypes", gdn_target, case)


@examples(0.5)
@given(case=mixer_cases(where=lambda geo: geo["a_log"] != "[B,T,Hv]" or geo["dt_bias"] != "[B,T,Hv]"))
def test_param_gradient_equals_sum_of_broadcast_gradient(gdn_target, case):
    check_property("param_gradient_is_broadcast_sum", gdn_target, case)
