"""Causal depthwise Conv1D + SiLU: forward and the decoupled backward.

The backward is a plain-JAX shift-multiply, independent of the recurrence
kernels ("decoupled"): it runs after the delta-rule backward, from the
pre-activation recomputed from x.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def shift(x, s: int):
    """x[:, t - s] along axis 1 (time), zero where t - s is outside [0, T).
    s > 0 delays (reads the past), s < 0 advances (reads the future).
    x [B, T, C]."""
    t = x.shape[1]
    if s == 0:
        return x
    if abs(s) >= t:
        return jnp.zeros_like(x)
    pad = jnp.zeros(x.shape[:1] + (abs(s),) + x.shape[2:], x.dtype)
    if s > 0:
        return jnp.concatenate([pad, x[:, : t - s]], axis=1)
    return jnp.concatenate([x[:, -s:], pad], axis=1)


def _tap(x, valid, j):
    """x where tap j is valid (valid [K, B, T] bool or None: all valid)."""
    return x if valid is None else jnp.where(valid[j][..., None], x, 0.0)


def conv1d_preactivation(x, weight, valid=None):
    """pre[b,t,c] = sum_j weight[j,c] * x[b, t-(K-1)+j, c].

    x [B, T, C], weight [K, C], both already in the accumulation dtype;
    valid [K, B, T] bool or None: tap j at t reads only where valid[j, b, t]
    (packed documents, segments.ConvWindows). Returns [B, T, C].
    """
    width = weight.shape[0]
    pre = jnp.zeros_like(x)
    for j in range(width):
        pre = pre + weight[j] * _tap(shift(x, width - 1 - j), valid, j)
    return pre


def silu_grad(z):
    """d silu(z) / dz = sigmoid(z) (1 + z (1 - sigmoid(z)))."""
    s = jax.nn.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def conv1d_silu_forward(x, weight):
    """y = silu(conv1d(x)). x [B, T, C], weight [K, C] -> (y, pre) [B, T, C]."""
    pre = conv1d_preactivation(x, weight)
    return jax.nn.silu(pre), pre


def conv1d_backward(x, weight, dpre, valid=None):
    """Cotangents of x [B, T, C] and weight [K, C] given dpre [B, T, C]
    (valid as in conv1d_preactivation).

    dx[b,s,c] = sum_j weight[j,c] * (valid_j dpre)[b, s+(K-1)-j, c]
    dw[j,c]   = sum_{b,t} (valid_j dpre)[b,t,c] * x[b, t-(K-1)+j, c]
    """
    width = weight.shape[0]
    dx = jnp.zeros_like(dpre)
    dw = []
    for j in range(width):
        s = width - 1 - j
        dpre_j = _tap(dpre, valid, j)
        dx = dx + weight[j] * shift(dpre_j, -s)
        dw.append(jnp.sum(dpre_j * shift(x, s), axis=(0, 1)))
    return dx, jnp.stack(dw, axis=0)
