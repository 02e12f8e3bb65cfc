"""Two planted bugs of different failure classes (tolerance.failure_class),
on the float32 scan of verification.fixture_kernels.foreign_targets.float32_only_scan:

- bfloat16 activations: the final state comes back rounded to bfloat16 (a
  state kept in bf16 at the boundary: a bf16-only final_state deviation);
- float32 activations with a strongly decaying token (g < -50) after the
  first 16 tokens: the cotangent of g is NaN there (a non-finite float32
  gradient on some inputs: a later chunk's overflow, say).

A run must tell them apart: two counterexample files, each replaying its
own failure, and the summary's worst row (the non-finite dg) naming the
second (verification/tests/test_mutation_zoo.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..foreign_targets import float32_only_scan as _scan

STRONG = -50.0
FIRST_CHUNK = 16


@jax.custom_vjp
def _nan_cotangent_where_strong(g):
    """The identity on g [B, T, Hv]; its VJP is NaN where g < STRONG at a
    token t >= FIRST_CHUNK."""
    return g


def _fwd(g):
    return g, g


def _bwd(g, ct):
    late = jnp.arange(g.shape[1])[None, :, None] >= FIRST_CHUNK
    return (jnp.where((g < STRONG) & late, jnp.nan, ct),)


_nan_cotangent_where_strong.defvjp(_fwd, _bwd)


def gated_delta_rule(q, k, v, g, beta, **kw):
    if v.dtype == jnp.float32:
        g = _nan_cotangent_where_strong(g)
    o, final_state = _scan.gated_delta_rule(q, k, v, g, beta, **kw)
    if v.dtype == jnp.bfloat16:
        final_state = final_state.astype(jnp.bfloat16).astype(final_state.dtype)
    return o, final_state


gdn_decoupled_conv1d = _scan.gdn_decoupled_conv1d
l2norm_forward = _scan.l2norm_forward
l2norm_backward = _scan.l2norm_backward
