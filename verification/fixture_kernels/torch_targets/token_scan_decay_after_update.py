"""token_scan with a planted bug: each step's decay applied after its
update (S <- exp(g) (S + beta k (v - k^T S))), so the fresh write decays
at once. What the suite must kill through the torch bridge."""

from __future__ import annotations

import functools

import torch

from verification import adapt, from_torch, mixer_from_core

from .token_scan import token_scan


def update_then_decay(state, k_t, v_t, decay_t, beta_t):
    """The bug: the decay of step t applied after step t's write."""
    predicted = torch.einsum("bhk,bhkv->bhv", k_t, state)
    state = state + torch.einsum("bhk,bhv->bhkv", k_t, beta_t[..., None] * (v_t - predicted))
    return state * torch.exp(decay_t)[..., None, None]


GDN_KERNEL = mixer_from_core(adapt(from_torch(functools.partial(token_scan,
                                                                step=update_then_decay)),
                                   heads="equal", varlen=None, chunk_size=None))
