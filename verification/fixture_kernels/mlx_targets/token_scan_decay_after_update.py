"""token_scan (MLX) with a planted bug: each step's decay applied after its
update, so the fresh write decays at once. What the suite must kill
through the MLX bridge."""

from __future__ import annotations

import functools

import mlx.core as mx

from verification import adapt, from_mlx, mixer_from_core

from .token_scan import token_scan


def update_then_decay(state, k_t, v_t, decay_t, beta_t):
    """The bug: the decay of step t applied after step t's write."""
    predicted = (k_t[..., None, :] @ state)[..., 0, :]
    state = state + k_t[..., :, None] * (beta_t[..., None] * (v_t - predicted))[..., None, :]
    return state * mx.exp(decay_t)[..., None, None]


GDN_KERNEL = mixer_from_core(adapt(from_mlx(functools.partial(token_scan,
                                                              step=update_then_decay)),
                                   heads="equal", varlen=None, chunk_size=None))
