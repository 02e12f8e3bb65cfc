"""Gates: g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b).

`a_log` and `dt_bias` are [Hv], [B', Hv] or [B', T', Hv] with B' in {1, B}
and T' in {1, T}. Their cotangents are reduced by `reduce_to_param_shape`:
summed over exactly the axes along which they were broadcast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def as_rank3(p):
    """[Hv] -> [1, 1, Hv]; [B', Hv] -> [B', 1, Hv]; [B', T', Hv] as given."""
    if p.ndim == 1:
        return p[None, None, :]
    if p.ndim == 2:
        return p[:, None, :]
    return p


def reduce_to_param_shape(ct, param_shape):
    """Sum a per-token cotangent ct [B, T, Hv] down to `param_shape`.

    Sums over the axes where the rank-3 view of the parameter has size 1 and
    ct does not, keeps every other axis, and returns exactly `param_shape`.
    """
    param_shape = tuple(param_shape)
    if len(param_shape) == 1:
        rank3 = (1, 1) + param_shape
    elif len(param_shape) == 2:
        rank3 = (param_shape[0], 1, param_shape[1])
    else:
        rank3 = param_shape
    axes = tuple(i for i in range(3) if rank3[i] == 1 and ct.shape[i] != 1)
    reduced = jnp.sum(ct, axis=axes, keepdims=True) if axes else ct
    return reduced.reshape(param_shape)


def softplus(z):
    """log(1 + exp(z)), overflow-safe."""
    return jnp.logaddexp(z, 0.0)


def gate_forward(a, a_log, dt_bias):
    """g [B, T, Hv] from a [B, T, Hv] and broadcastable a_log, dt_bias
    (all in the accumulation dtype)."""
    return -jnp.exp(as_rank3(a_log)) * softplus(a + as_rank3(dt_bias))


def gate_backward(a, a_log, dt_bias, dg, pad=None):
    """Cotangents (da, da_log, ddt_bias), each of its primal's shape.

    dg/da = dg/ddt_bias = -exp(a_log) * sigmoid(a + dt_bias); dg/da_log = g.
    pad [B, T] bool or None: padding tokens contribute exactly 0 (a select,
    so arbitrary padding values of a or a [B, T, Hv] a_log cannot leak).
    """
    a_log3, dt3 = as_rank3(a_log), as_rank3(dt_bias)
    z = a + dt3
    decay_rate = jnp.exp(a_log3)
    da = dg * (-decay_rate * jax.nn.sigmoid(z))
    da_log_full = dg * (-decay_rate * softplus(z))
    if pad is not None:
        da = jnp.where(pad[..., None], 0.0, da)
        da_log_full = jnp.where(pad[..., None], 0.0, da_log_full)
    return (da,
            reduce_to_param_shape(da_log_full, a_log.shape),
            reduce_to_param_shape(da, dt_bias.shape))


def beta_forward(b):
    """beta = sigmoid(b), [B, T, Hv]."""
    return jax.nn.sigmoid(b)


def beta_backward(b, dbeta):
    """db = dbeta * sigmoid(b) * (1 - sigmoid(b))."""
    s = jax.nn.sigmoid(b)
    return dbeta * s * (1.0 - s)
