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
