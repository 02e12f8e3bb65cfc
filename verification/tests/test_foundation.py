"""Structural checks of the foundation that no numeric property can see."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_kernels
from gdn_kernels import (chunk_math, conv1d, delta_rule, gates, l2norm, mixer, pallas_impl,
                         xla_impl)

BACKWARD_MODULES = (chunk_math, conv1d, delta_rule, gates, l2norm, mixer, xla_impl, pallas_impl)
AUTODIFF = re.compile(r"\bjax\.(vjp|grad|value_and_grad|jvp|linearize|linear_transpose)\b"
                      r"|\bfrom jax import .*\b(vjp|grad|linear_transpose)\b")


def test_chunked_backward_is_hand_written():
    """The custom_vjp backward of the xla and pallas paths calls no JAX
    autodiff of the forward (the oracle, reference.py, is the only autodiff)."""
    for module in BACKWARD_MODULES:
        source = inspect.getsource(module)
        assert not AUTODIFF.search(source), f"{module.__name__} uses JAX autodiff"


def test_custom_vjps_use_the_hand_written_rules():
    """Both public ops differentiate through custom_vjp objects whose bwd
    rules are the hand-written functions of delta_rule.py and mixer.py."""
    assert delta_rule._delta_rule_vjp.bwd is delta_rule._bwd
    assert mixer._mixer_vjp.bwd is mixer._bwd


def test_padding_leaves_final_state_unaffected():
    """T not a multiple of C: identity padding steps keep the final state equal
    to the unpadded run's (C = T exactly, no padding)."""
    rng = np.random.default_rng(1)
    b, t, hk, hv, d = 1, 32, 1, 1, 8
    q = rng.standard_normal((b, t, hk, d)).astype(np.float32) / 3
    v = rng.standard_normal((b, t, hv, d)).astype(np.float32)
    g = -rng.uniform(0, 1, (b, t, hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (b, t, hv)).astype(np.float32)
    for impl in ("xla", "pallas"):
        _, exact = gdn_kernels.gated_delta_rule(q, q, v, g, beta, chunk_size=32, impl=impl)
        _, padded = gdn_kernels.gated_delta_rule(q, q, v, g, beta, chunk_size=64, impl=impl)
        np.testing.assert_allclose(np.asarray(padded), np.asarray(exact), rtol=2e-6, atol=2e-6)


_conv_backward_blocks = jax.jit(conv1d.conv1d_silu_backward)
_conv_backward_one_block = jax.jit(conv1d._block_backward)


@pytest.mark.parametrize("width", [1, 4, 70])
@pytest.mark.parametrize("t", [1, 63, 128, 129, 200])
def test_conv_backward_blocks_equal_one_block(t, width):
    """conv1d_silu_backward walks the row in blocks and stitches their
    overlapping windows (into the previous block, or into the history): it
    equals the whole row taken as one block, for rows shorter than a block,
    exact multiples of it, a tail, and K-1 wider than TIME_BLOCK."""
    rng = np.random.default_rng(t * 100 + width)
    b, c = 2, 8
    ext = jnp.asarray(rng.standard_normal((b, width - 1 + t, c)), jnp.float32)
    weight = jnp.asarray(rng.standard_normal((width, c)) / width, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((b, t, c)), jnp.float32)
    dhist, drow, dw = _conv_backward_blocks(ext, weight, dy)
    want_dext, want_dw = _conv_backward_one_block(ext, weight, dy, None)
    got_dext = np.concatenate([np.asarray(dhist), np.asarray(drow)], axis=1)
    np.testing.assert_allclose(got_dext, np.asarray(want_dext), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw), np.asarray(want_dw), rtol=1e-5, atol=1e-4)


def test_every_mutant_patch_applies_and_changes_compiled_code():
    """Each seeded bug's patch site occurs exactly as declared, changes code
    (not a comment), and changes the compiled bytecode of at least one
    function: a renamed or moved kernel line fails here, naming the mutant,
    instead of surfacing as a surviving mutant."""
    from verification.mutants import MUTANTS, changed_functions, mutated_source

    for name, mutant in MUTANTS.items():
        source, mutated = mutated_source(name)
        assert changed_functions(source, mutated, mutant.file), \
            f"mutant {name}: no compiled function changes"
