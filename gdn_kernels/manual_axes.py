"""Types of values under jax.shard_map (check_vma=True): which manual mesh axes
a value varies over. Outside shard_map every function here is the identity.

A scan carry that starts from a constant is invariant, while the body makes
it vary with the inputs: the carry must start varying (varying_like). A
custom_vjp must return each cotangent with its primal's type: its inputs are
first cast to one common type (align_varying), and JAX transposes that cast
into the psum an invariant input's gradient needs (a parameter shared by the
batch shards gets its gradient summed over them, by construction).
"""

from __future__ import annotations

import jax


def varying_axes(*trees) -> frozenset:
    """The manual mesh axes that some array leaf of trees varies over."""
    return frozenset().union(*(jax.typeof(x).mat.varying for x in jax.tree.leaves(trees)))


def _cast_to_vary(x, axes):
    """x varying over axes as well as over its own."""
    missing = axes - jax.typeof(x).mat.varying
    return jax.lax.pcast(x, tuple(sorted(missing)), to="varying") if missing else x


def varying_like(x, *refs):
    """x (an array) typed as varying over every axis some leaf of refs varies over."""
    return _cast_to_vary(x, varying_axes(*refs))


def align_varying(*trees):
    """trees, every array leaf varying over the union of their axes."""
    axes = varying_axes(*trees)
    return jax.tree.map(lambda x: _cast_to_vary(x, axes), trees) if axes else trees
