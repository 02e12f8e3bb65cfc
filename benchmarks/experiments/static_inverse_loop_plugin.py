"""pytest plugin for checking the proposed chunk_math fix: _forward_substitute
with a static Python loop instead of lax.fori_loop(jnp.int32(1), jnp.int32(n))
(n <= INVERSE_BLOCK = 16, so 15 unrolled [16, 16] dots; `row == i` compares an
int32 iota with a Python int and stays int32, so no int64 index reaches Mosaic
under jax_enable_x64). With it, jax.grad through xla_impl.forward works.

  PYTHONPATH=benchmarks/experiments JAX_ENABLE_X64=1 python -m pytest -p static_inverse_loop_plugin \
      verification/test_pallas_kernels.py -k lowers_for_tpu
"""
import jax.numpy as jnp

from gdn_kernels import chunk_math as cm


def _forward_substitute(a):
    n = a.shape[0]
    row, col = cm._row_col(n)
    inv = (row == col).astype(a.dtype)
    for i in range(1, n):
        a_row_i = jnp.where(row == i, a, 0.0)  # only row i of a survives
        inv = inv - cm._dot(a_row_i, inv)
    return inv


cm._forward_substitute = _forward_substitute
