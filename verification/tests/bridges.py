"""What the bridges' tests check alike (test_torch_bridge.py,
test_mlx_bridge.py), each on its own framework's from_*."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

DTYPES = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.bfloat16}


def product_and_difference(x, y):
    """Elementwise ops every framework rounds as JAX does: exact to compare."""
    return x * y, x - y


def check_dtypes_cross_exactly(from_framework: Callable, dtype: str) -> None:
    """from_framework(product_and_difference) equals JAX's results bit for
    bit in dtype, under jit inside an x64 context for float64, and its
    gradients come back exact in the inputs' dtypes."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(dtype == "float64"):
        x, y = (jnp.asarray(rng.standard_normal((3, 5)), DTYPES[dtype]) for _ in range(2))
        prod, diff = jax.jit(from_framework(product_and_difference))(x, y)
        assert prod.dtype == diff.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(prod), np.asarray(x * y))
        np.testing.assert_array_equal(np.asarray(diff), np.asarray(x - y))
        ct = jnp.asarray(rng.standard_normal((3, 5)), DTYPES[dtype])
        _, pullback = jax.vjp(from_framework(product_and_difference), x, y)
        dx, dy = jax.jit(pullback)((ct, ct))
        assert dx.dtype == dy.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(dx), np.asarray(ct * y + ct))
        np.testing.assert_array_equal(np.asarray(dy), np.asarray(ct * x - ct))
