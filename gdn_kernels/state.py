"""Carried state of the mixer (docs/contract.md section 7)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class GDNState(NamedTuple):
    """What one gdn_decoupled_conv1d call hands to the next.

    conv      [B, K-1, C] in x's dtype: the K-1 conv inputs the next token of
              the row's last document reads in its window (zeros before that
              document's start; the incoming history where it continues it)
    recurrent [B, Hv, Dk, Dv] float32: the delta-rule state after the row's
              last document
    """
    conv: jnp.ndarray
    recurrent: jnp.ndarray


def zero_recurrent(batch: int, v_heads: int, dk: int, dv: int, dtype) -> jnp.ndarray:
    """The recurrent state no state stands for: zeros [B, Hv, Dk, Dv] in the
    accumulation dtype of activations of `dtype` (float32; float64 for
    float64 inputs)."""
    from .chunk_math import accumulation_dtype
    return jnp.zeros((batch, v_heads, dk, dv), accumulation_dtype(dtype))


def zero_state(x, conv_width: int, v_heads: int, dk: int, dv: int) -> GDNState:
    """The GDNState `state=None` stands for (docs/contract.md section 7):
    conv zeros [B, K-1, C] in x's dtype, recurrent zeros (zero_recurrent)."""
    batch, _, channels = x.shape
    return GDNState(jnp.zeros((batch, conv_width - 1, channels), x.dtype),
                    zero_recurrent(batch, v_heads, dk, dv, x.dtype))
