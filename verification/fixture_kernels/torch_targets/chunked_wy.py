"""The gated delta rule by chunks (the WY form), in PyTorch, with a
hand-written torch.autograd.Function backward: the pattern of field
kernels, whose backward is their own code. Conventions as token_scan's
(fla's: equal heads, a log decay, the state [B, H, Dk, Dv]), plus a
chunk_size argument.

Within a chunk of C tokens entering with state S0 (Gam_i the inclusive
cumulative log decay, D_ij = exp(Gam_i - Gam_j) for j <= i):
    (I + A) u = beta v - beta exp(Gam) K S0,   A_ij = beta_i (k_i . k_j) D_ij, j < i
    o_i  = scale (exp(Gam_i) q_i^T S0 + sum_{j<=i} D_ij (q_i . k_j) u_j)
    S_C  = exp(Gam_C) S0 + sum_j exp(Gam_C - Gam_j) k_j u_j^T
computed in float32 (float64 for float64 inputs); Gam in float64 in
every case, so its differences keep their digits under strong decay.

The backward keeps only the states entering each chunk (the forward's
residuals) and walks the chunks last to first: it recomputes one chunk
under autograd and carries the state's cotangent into the chunk before.
"""

from __future__ import annotations

import torch

from verification import adapt, from_torch, mixer_from_core


def _accumulation_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def chunk_step(q, k, v, g, beta, state, scale):
    """One chunk: (o [B, H, C, Dv], state after it [B, H, Dk, Dv]) from
    q, k [B, H, C, Dk], v [B, H, C, Dv], g, beta [B, H, C] and the entering
    state, all in the accumulation dtype."""
    acc = state.dtype
    c = q.shape[2]
    gam = torch.cumsum(g.to(torch.float64), dim=-1)                       # [B, H, C]
    lower = torch.tril(torch.ones(c, c, dtype=torch.bool, device=q.device))
    diff = gam[..., :, None] - gam[..., None, :]
    decay = torch.where(lower, torch.exp(torch.where(lower, diff, 0.0)), 0.0).to(acc)
    gam_exp = torch.exp(gam).to(acc)[..., None]                          # [B, H, C, 1]
    tail = torch.exp(gam[..., -1:] - gam).to(acc)[..., None]              # [B, H, C, 1]
    kk = k @ k.transpose(-1, -2)
    a = torch.tril(beta[..., None] * kk * decay, diagonal=-1)
    eye = torch.eye(c, dtype=acc, device=q.device)
    rhs = torch.cat([beta[..., None] * v, beta[..., None] * gam_exp * k], dim=-1)
    solved = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    u_plain, w = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]
    u = u_plain - w @ state
    qk = torch.tril(q @ k.transpose(-1, -2)) * decay
    o = scale * ((q * gam_exp) @ state + qk @ u)
    new_state = torch.exp(gam[..., -1]).to(acc)[..., None, None] * state \
        + (k * tail).transpose(-1, -2) @ u
    return o, new_state


def _chunks(x, c):
    """[B, H, T, ...] (T a multiple of c) -> the chunks along T."""
    return torch.split(x, c, dim=2)


class ChunkedDeltaRule(torch.autograd.Function):
    """(o, final state) of head-first, padded, accumulation-dtype inputs;
    backward by chunks, last to first (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, state, scale, chunk):
        entering, outs = [], []
        for pieces in zip(*(_chunks(x, chunk) for x in (q, k, v, g, beta))):
            entering.append(state)
            o, state = chunk_step(*pieces, state, scale)
            outs.append(o)
        ctx.save_for_backward(q, k, v, g, beta, *entering)
        ctx.scale, ctx.chunk = scale, chunk
        return torch.cat(outs, dim=2), state

    @staticmethod
    def backward(ctx, d_o, d_state):
        return chunkwise_backward(ctx, d_o, d_state, carry=entering_state_cotangent)


def entering_state_cotangent(d_entering, d_leaving):
    """The state cotangent handed to the chunk before: that of the state
    entering this chunk (d_leaving: the one this chunk was handed)."""
    del d_leaving
    return d_entering


def chunkwise_backward(ctx, d_o, d_state, carry):
    """ChunkedDeltaRule's input cotangents: each chunk, last to first,
    recomputed under autograd from its entering state; `carry` hands the
    state cotangent to the chunk before."""
    q, k, v, g, beta, *entering = ctx.saved_tensors
    chunk = ctx.chunk
    grads = [[] for _ in range(5)]
    d_state = torch.zeros_like(entering[0]) if d_state is None else d_state
    pieces = list(zip(*(_chunks(x, chunk) for x in (q, k, v, g, beta, d_o))))
    for (*inputs, d_o_chunk), state in reversed(list(zip(pieces, entering))):
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (*inputs, state)]
            o, new_state = chunk_step(*leaves, ctx.scale)
            found = torch.autograd.grad((o, new_state), leaves, (d_o_chunk, d_state))
        for store, grad in zip(grads, found[:5]):
            store.insert(0, grad)
        d_state = carry(found[5], d_state)
    return (*(torch.cat(store, dim=2) for store in grads), d_state, None, None)


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                           chunk_size=64, function=ChunkedDeltaRule):
    """(o [B, T, H, Dv] in v's dtype, final state [B, H, Dk, Dv] float32 or
    float64) of q, k [B, T, H, Dk], v [B, T, H, Dv], g, beta [B, T, H], by
    `function` (an autograd.Function of ChunkedDeltaRule's signature)."""
    acc = _accumulation_dtype(q)
    b, t, h, dk = q.shape
    dv, out_dtype = v.shape[-1], v.dtype
    scale = dk ** -0.5 if scale is None else scale
    pad = -t % chunk_size
    head_first = [torch.nn.functional.pad(x.to(acc).transpose(1, 2),
                                          (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
                  for x in (q, k, v, g, beta)]
    state = (torch.zeros(b, h, dk, dv, dtype=acc, device=q.device) if initial_state is None
             else initial_state.to(acc))
    o, final = function.apply(*head_first, state, scale, chunk_size)
    return o[:, :, :t].transpose(1, 2).to(out_dtype), final


GDN_KERNEL = mixer_from_core(adapt(from_torch(chunk_gated_delta_rule), heads="equal",
                                   varlen=None))
