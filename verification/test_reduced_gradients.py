"""Property 4: shape preservation of reduced (a_log / dt_bias) gradients."""

from hypothesis import given

from .harness import check_property, examples
from .suite import SUITE


@examples(SUITE["cotangent_shapes_and_dtypes"].weight)
@given(case=SUITE["cotangent_shapes_and_dtypes"].strategy)
def test_every_cotangent_has_its_primal_shape_and_dtype(gdn_target, case):
    check_property("cotangent_shapes_and_dtypes", gdn_target, case)


@examples(SUITE["param_gradient_is_broadcast_sum"].weight)
@given(case=SUITE["param_gradient_is_broadcast_sum"].strategy)
def test_param_gradient_equals_sum_of_broadcast_gradient(gdn_target, case):
    check_property("param_gradient_is_broadcast_sum", gdn_target, case)
