"""QK L2 normalisation: y = x * rsqrt(sum(x^2, -1) + eps), and its exact VJP.

The forward and the backward take `eps` as an argument; the mixer passes one
value, from one place, to both. An all-zero row gives y = 0 and
dx = dy / sqrt(eps): finite.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

DEFAULT_EPS = 1e-6


def l2norm_forward(x, eps: float):
    """x [..., D] -> x * rsqrt(sum(x^2, -1) + eps), same shape."""
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def l2norm_backward(x, dy, eps: float):
    """Exact VJP of l2norm_forward at x for cotangent dy (both [..., D]).

    With r = rsqrt(|x|^2 + eps): dx = r dy - r^3 x (x . dy).
    """
    r = lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)
    return r * dy - (r * r * r) * x * jnp.sum(x * dy, axis=-1, keepdims=True)
