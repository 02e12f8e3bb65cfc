"""A wrong target: the bfloat16-compute kernel (foreign_targets.bf16_compute_chunked,
declared so) whose bfloat16 path applies each token's gate to the next
token (an off-by-one in the gate's alignment, the first token undecayed):
wrong far beyond bfloat16 compute, so its declaration must not hide it.
Its float32 path and its mixer are the correct kernel's."""

import jax.numpy as jnp

from verification.targets.declaration import KernelDeclaration
from verification.fixture_kernels.foreign_targets import bf16_compute_chunked as _chunked


def gated_delta_rule(q, k, v, g, beta, **kwargs):
    if v.dtype == jnp.bfloat16:
        g = jnp.pad(g[:, :-1], ((0, 0), (1, 0), (0, 0)))
    return _chunked.gated_delta_rule(q, k, v, g, beta, **kwargs)


GDN_KERNEL = KernelDeclaration(
    gated_delta_rule=gated_delta_rule,
    gdn_decoupled_conv1d=_chunked.gdn_decoupled_conv1d,
    supports=_chunked.GDN_KERNEL.supports)
