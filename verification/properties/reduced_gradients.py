"""Shape preservation of reduced gradients: every cotangent has its primal's
shape and dtype, and a broadcast a_log / dt_bias gets exactly the sum of the
broadcast gradient over the axes it was broadcast along (a [B, Hv]
parameter keeps its batch axis)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from strategies import mixer_cases
from strategies.cases import MixerCase, replace

from ..engine import runners
from ..engine.registry import prop, shape_claim
from ..tolerance import compare_self
from .common import PER_BATCH_A_LOG, dtype_of, shape_dtype_row

PARAM_RANK_COVERS = {
    "[B,Hv] a_log": PER_BATCH_A_LOG,
    "[B,1,Hv] dt_bias": shape_claim(lambda c: c.dt_bias_shape == (c.batch, 1, c.v_heads)
                                    and c.batch > 1),
    "[1,T,Hv] a_log": shape_claim(lambda c: len(c.a_log_shape) == 3 and c.a_log_shape[:2] == (
        1, c.seq_len) and c.seq_len > 1),
    "[Hv] dt_bias": shape_claim(lambda c: len(c.dt_bias_shape) == 1),
    # a batch axis of size 1 at B=1: what a kernel taking per-batch parameters
    # at a batch of one only (declared Limits) loses to a sum over (0, 1)
    "[1,Hv] a_log": shape_claim(lambda c: c.a_log_shape == (1, c.v_heads)),
}


@prop("cotangent_shapes_and_dtypes", family="reduced_gradients", strategy=mixer_cases(),
      weight=4, wrong_target="gdn_mutant_param_grad_axis_01:xla", covers=PARAM_RANK_COVERS)
def cotangent_shapes_and_dtypes(target, case: MixerCase):
    """Every cotangent of gdn_decoupled_conv1d has exactly its primal's shape
    and dtype (a [B, Hv] a_log keeps its batch axis), checked abstractly."""
    inputs = runners.case_inputs(case)
    fn = runners.target_fn(target, "mixer")
    kw = dict(runners.mixer_static(case))
    names = tuple(inputs)

    def run(*arrays):
        out, pullback = jax.vjp(lambda *a: fn(*a, **kw), *arrays)
        return pullback(jnp.zeros(out.shape, out.dtype))

    specs = [jax.ShapeDtypeStruct(inputs[n].shape, inputs[n].dtype) for n in names]
    grads = jax.eval_shape(run, *specs)
    return [shape_dtype_row("d" + n, g, inputs[n]) for n, g in zip(names, grads)]


def _sum_to_param_shape(g_full, shape):
    """Sum a [B, T, Hv] gradient over the axes a parameter of `shape` was
    broadcast along. Written here, independently of gdn_kernels.gates, so
    the property does not trust the code it checks."""
    if len(shape) == 1:
        rank3 = (1, 1) + tuple(shape)
    elif len(shape) == 2:
        rank3 = (shape[0], 1, shape[1])
    else:
        rank3 = tuple(shape)
    for axis in range(3):
        if rank3[axis] == 1 and g_full.shape[axis] != 1:
            g_full = g_full.sum(axis=axis, keepdims=True)
    return g_full.reshape(shape)


@prop("param_gradient_is_broadcast_sum", family="reduced_gradients",
      strategy=mixer_cases(where=lambda g: g["a_log"] != "[B,T,Hv]" or g["dt_bias"] != "[B,T,Hv]"),
      weight=0.5, wrong_target="gdn_mutant_param_grad_axis_01:xla", covers=PARAM_RANK_COVERS)
def param_gradient_is_broadcast_sum(target, case: MixerCase):
    """A 1-D / 2-D a_log and dt_bias gradient equals the sum over the
    broadcast axes of the gradient of the same values broadcast to
    [B, T, Hv] (and the [B, Hv] gradient keeps its batch axis)."""
    inputs = runners.case_inputs(case)
    full = (case.batch, case.seq_len, case.v_heads)
    full_inputs = dict(inputs)
    for n in ("a_log", "dt_bias"):
        p = inputs[n]
        p3 = p[None, None] if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)
        full_inputs[n] = np.ascontiguousarray(np.broadcast_to(p3, full))
    full_case = replace(case, a_log_shape=full, dt_bias_shape=full)
    _, g_small = runners.target_vjp(target, case, inputs)
    _, g_full = runners.target_vjp(target, full_case, full_inputs)
    rows = []
    for n in ("a_log", "dt_bias"):
        summed = _sum_to_param_shape(g_full[n].astype(np.float64), inputs[n].shape)
        rows.append(shape_dtype_row("d" + n, g_small[n], inputs[n]))
        rows.append(compare_self("d" + n + " vs sum", g_small[n], summed, dtype_of(case, n)))
    return rows
