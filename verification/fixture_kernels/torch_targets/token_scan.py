"""The gated delta rule token by token, in PyTorch, in fla's conventions:
q, k, v [B, T, H, D] with equal heads, g [B, T, H] a log decay, beta
[B, T, H] a probability, state [B, H, Dk, Dv]; o in v's dtype and the
final state in float32 (float64 for float64 inputs). Gradients by plain
torch autograd. A target of the suite through from_torch and adapt."""

from __future__ import annotations

import torch

from verification import adapt, from_torch, mixer_from_core


def decay_then_update(state, k_t, v_t, decay_t, beta_t):
    """One step: S <- exp(g) S, then S <- S + beta k (v - k^T S).
    state [B, H, Dk, Dv]; k_t [B, H, Dk]; v_t [B, H, Dv]; decay_t, beta_t [B, H]."""
    state = state * torch.exp(decay_t)[..., None, None]
    predicted = torch.einsum("bhk,bhkv->bhv", k_t, state)
    return state + torch.einsum("bhk,bhv->bhkv", k_t, beta_t[..., None] * (v_t - predicted))


def token_scan(q, k, v, g, beta, *, scale=None, initial_state=None, step=decay_then_update):
    """(o [B, T, H, Dv], final state [B, H, Dk, Dv]) of the recurrence, each
    step by `step`; computed in float32 (float64 for float64 inputs)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, t, h, dk = q.shape
    dv, out_dtype = v.shape[-1], v.dtype
    scale = dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    state = (torch.zeros(b, h, dk, dv, dtype=acc, device=q.device) if initial_state is None
             else initial_state.to(acc))
    outs = []
    for i in range(t):
        state = step(state, k[:, i], v[:, i], g[:, i], beta[:, i])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, state))
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(b, 0, h, dv, dtype=acc)
    return o.to(out_dtype), state


# the core op in fla's conventions; its mixer is the suite's reference layer
# feeding it (the mixer properties then check the torch core inside a layer)
GDN_KERNEL = mixer_from_core(adapt(from_torch(token_scan), heads="equal", varlen=None,
                                   chunk_size=None))
