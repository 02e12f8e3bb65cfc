"""The gated delta rule token by token, in MLX, in fla's conventions:
q, k, v [B, T, H, D] with equal heads, g [B, T, H] a log decay, beta
[B, T, H] a probability, state [B, H, Dk, Dv]; o in v's dtype and the
final state in float32 (float64 for float64 inputs). Gradients by MLX's
own autodiff. A target of the suite through from_mlx and adapt."""

from __future__ import annotations

import mlx.core as mx

from verification import adapt, from_mlx, mixer_from_core


def decay_then_update(state, k_t, v_t, decay_t, beta_t):
    """One step: S <- exp(g) S, then S <- S + beta k (v - k^T S).
    state [B, H, Dk, Dv]; k_t [B, H, Dk]; v_t [B, H, Dv]; decay_t, beta_t [B, H]."""
    state = state * mx.exp(decay_t)[..., None, None]
    predicted = (k_t[..., None, :] @ state)[..., 0, :]
    return state + k_t[..., :, None] * (beta_t[..., None] * (v_t - predicted))[..., None, :]


def token_scan(q, k, v, g, beta, *, scale=None, initial_state=None, step=decay_then_update):
    """(o [B, T, H, Dv], final state [B, H, Dk, Dv]) of the recurrence, each
    step by `step`; computed in float32 (float64 for float64 inputs)."""
    acc = mx.float64 if q.dtype == mx.float64 else mx.float32
    b, t, h, dk = q.shape
    dv, out_dtype = v.shape[-1], v.dtype
    scale = dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.astype(acc) for x in (q, k, v, g, beta))
    state = (mx.zeros((b, h, dk, dv), dtype=acc) if initial_state is None
             else initial_state.astype(acc))
    outs = []
    for i in range(t):
        state = step(state, k[:, i], v[:, i], g[:, i], beta[:, i])
        outs.append(((q[:, i] * scale)[..., None, :] @ state)[..., 0, :])
    o = mx.stack(outs, axis=1) if outs else mx.zeros((b, 0, h, dv), dtype=acc)
    return o.astype(out_dtype), state


# the core op in fla's conventions; its mixer is the suite's reference layer
GDN_KERNEL = mixer_from_core(adapt(from_mlx(token_scan), heads="equal", varlen=None,
                                   chunk_size=None))
