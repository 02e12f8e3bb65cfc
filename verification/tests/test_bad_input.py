"""Bad input: one explicit test per validation rule of the contract (the
generated violations are the registered property bad_input_raises_named_error,
verification/properties/bad_input.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_kernels
from gdn_kernels import validation


def _mixer_args(b=1, t=5, hk=1, hv=2, dk=4, dv=3, k=4):
    c = 2 * hk * dk + hv * dv
    f = np.float32
    return dict(x=np.zeros((b, t, c), f), conv_weight=np.zeros((k, c), f),
                a=np.zeros((b, t, hv), f), b=np.zeros((b, t, hv), f),
                a_log=np.zeros((hv,), f), dt_bias=np.zeros((hv,), f),
                num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv, impl="xla")


@pytest.mark.parametrize("change, match, error", [
    (dict(x=np.zeros((1, 5, 15), np.float32)), r"x: expected shape \[1, 5, 14\]", ValueError),
    (dict(x=np.zeros((1, 0, 14), np.float32), a=np.zeros((1, 0, 2)), b=np.zeros((1, 0, 2))),
     r"x: sequence length T must be >= 1", ValueError),
    (dict(x=np.zeros((1, 5, 14), np.int32)), r"x must have a floating dtype", TypeError),
    (dict(conv_weight=np.zeros((4, 13), np.float32)), r"conv_weight: expected shape \[K, 14\]", ValueError),
    (dict(a=np.zeros((1, 6, 2), np.float32)), r"a: expected shape \[1, 5, 2\]", ValueError),
    (dict(b=np.zeros((1, 5, 2), np.float64)), r"activations must share one dtype", ValueError),
    (dict(a_log=np.zeros((3,), np.float32)), r"a_log: expected shape \[2\]", ValueError),
    (dict(a_log=np.zeros((2, 2), np.float32)), r"a_log: expected shape", ValueError),
    (dict(dt_bias=np.zeros((1, 4, 2), np.float32)), r"dt_bias: expected shape", ValueError),
    (dict(dt_bias=np.zeros((1, 1, 1, 2), np.float32)), r"dt_bias: expected shape", ValueError),
    (dict(num_k_heads=2, num_v_heads=3), r"num_v_heads=3 must be a multiple", ValueError),
    (dict(eps=0.0), r"eps must be a finite float > 0", ValueError),
    (dict(eps=-1.0), r"eps must be a finite float > 0", ValueError),
    (dict(chunk_size=48), r"chunk_size must be a power of two in 16..128", ValueError),
    (dict(chunk_size=256), r"chunk_size must be a power of two", ValueError),
    (dict(impl="cuda"), r"impl must be one of", ValueError),
    (dict(scale=float("nan")), r"scale must be None or a finite float", ValueError),
    (dict(conv_weight=np.zeros((4, 14), np.float16)), r"conv_weight has dtype float16", ValueError),
])
def test_mixer_validation_rule(change, match, error):
    args = _mixer_args() | change
    with pytest.raises(error, match=match):
        gdn_kernels.gdn_decoupled_conv1d(**args)


def _delta_args(b=1, t=5, hk=1, hv=2, dk=4, dv=3):
    f = np.float32
    return dict(q=np.zeros((b, t, hk, dk), f), k=np.zeros((b, t, hk, dk), f),
                v=np.zeros((b, t, hv, dv), f), g=np.zeros((b, t, hv), f),
                beta=np.zeros((b, t, hv), f), impl="xla")


@pytest.mark.parametrize("change, match, error", [
    (dict(q=np.zeros((1, 5, 4), np.float32)), r"q: expected a rank-4 array", ValueError),
    (dict(k=np.zeros((1, 5, 1, 3), np.float32)), r"k: expected shape \[1, 5, 1, 4\]", ValueError),
    (dict(v=np.zeros((1, 4, 2, 3), np.float32)), r"v: expected shape \[1, 5, Hv, Dv\]", ValueError),
    (dict(q=np.zeros((1, 5, 3, 4), np.float32), k=np.zeros((1, 5, 3, 4), np.float32)),
     r"v: value heads Hv=2 must be a multiple of key heads Hk=3", ValueError),
    (dict(g=np.zeros((1, 5, 3), np.float32)), r"g: expected shape \[1, 5, 2\]", ValueError),
    (dict(g=np.ones((1, 5, 2), np.float32)), r"g must be <= 0", ValueError),
    (dict(beta=np.zeros((1, 5, 2), np.int8)), r"beta must have a floating dtype", TypeError),
    (dict(initial_state=np.zeros((1, 2, 3, 4), np.float32)),
     r"initial_state: expected shape \[1, 2, 4, 3\]", ValueError),
    (dict(initial_state=np.zeros((1, 2, 4, 3), np.float16)), r"initial_state has dtype float16", ValueError),
    (dict(chunk_size=8), r"chunk_size must be a power of two", ValueError),
    (dict(chunk_size=True), r"chunk_size must be a power of two", ValueError),
])
def test_delta_rule_validation_rule(change, match, error):
    args = _delta_args() | change
    with pytest.raises(error, match=match):
        gdn_kernels.gated_delta_rule(**args)


def test_valid_minimal_inputs_run():
    o = gdn_kernels.gdn_decoupled_conv1d(**_mixer_args())
    assert o.shape == (1, 5, 2, 3) and o.dtype == jnp.float32
    o, s = gdn_kernels.gated_delta_rule(**_delta_args())
    assert o.shape == (1, 5, 2, 3) and s.shape == (1, 2, 4, 3) and s.dtype == jnp.float32


# segment_ids (docs/contract.md section 6): checked by the validation functions
# directly, so these rules do not depend on the public API accepting the keyword.
def _validate(op, segment_ids):
    if op == "mixer":
        a = _mixer_args()
        validation.validate_mixer(
            a["x"], a["conv_weight"], a["a"], a["b"], a["a_log"], a["dt_bias"],
            a["num_k_heads"], a["num_v_heads"], a["head_k_dim"], a["head_v_dim"],
            True, 1e-6, None, 64, a["impl"], segment_ids=segment_ids)
    else:
        a = _delta_args()
        validation.validate_gated_delta_rule(
            a["q"], a["k"], a["v"], a["g"], a["beta"], None, None, 64, a["impl"],
            segment_ids=segment_ids)


@pytest.mark.parametrize("op", ["mixer", "delta_rule"])
@pytest.mark.parametrize("segment_ids, match, error", [
    (np.ones((1, 5), np.float32), r"segment_ids must have an integer dtype", TypeError),
    (np.ones((1, 5), np.bool_), r"segment_ids must have an integer dtype", TypeError),
    ([[1, 1, 1, 1, 1]], r"segment_ids must be an array", TypeError),
    (np.ones((1, 5), np.int8), r"segment_ids has dtype int8", ValueError),
    (np.ones((1, 4), np.int32), r"segment_ids: expected shape \[1, 5\]", ValueError),
    (np.ones((2, 5), np.int32), r"segment_ids: expected shape \[1, 5\]", ValueError),
    (np.ones((5,), np.int32), r"segment_ids: expected shape \[1, 5\]", ValueError),
    (np.array([[1, 1, -1, 0, 2]], np.int32), r"segment_ids must be >= 0", ValueError),
    (np.array([[0, 0, 0, 0, -3]], np.int64), r"segment_ids must be >= 0", ValueError),
])
def test_segment_ids_validation_rule(op, segment_ids, match, error):
    with pytest.raises(error, match=match):
        _validate(op, segment_ids)


@pytest.mark.parametrize("op", ["mixer", "delta_rule"])
@pytest.mark.parametrize("segment_ids", [
    None, np.zeros((1, 5), np.int32), np.array([[0, 1, 1, 0, 7]], np.int64)])
def test_valid_segment_ids_pass(op, segment_ids):
    _validate(op, segment_ids)


@pytest.mark.parametrize("op", ["mixer", "delta_rule"])
def test_traced_segment_ids_skip_the_value_check(op):
    """Under jit the values are unknown: dtype and shape are still checked."""
    negative = jnp.full((1, 5), -1, jnp.int32)
    jax.jit(lambda ids: _validate(op, ids))(negative)
    with pytest.raises(ValueError, match=r"segment_ids: expected shape \[1, 5\]"):
        jax.jit(lambda ids: _validate(op, ids))(negative[:, :4])
