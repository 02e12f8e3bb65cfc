"""The oracle: token-by-token gated delta rule and the whole GDN mixer in
plain JAX, differentiated by JAX autodiff.

Written independently of the kernels' stage files: the conv is
`lax.conv_general_dilated`, the norm, gates and recurrence follow the
contract's formulas line by line. It computes in float64 when the inputs are
float64 (enable x64), else in float32.

With `segment_ids` (docs/contract.md section 6) both ops run the deletion
definition directly, one token per scan step: padding is skipped, documents
restart from a zero carry, and the mixer's conv reads a carried window of the
document's previous inputs instead of calling `lax.conv_general_dilated`.

With a carried `state` (docs/contract.md section 7) the mixer's conv reads
`state.conv` before token 0 and the recurrence starts from `state.recurrent`;
`return_state=True` also returns the `GDNState` the next call continues from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from gdn_kernels.manual_axes import align_varying
from gdn_kernels.state import GDNState


def compute_dtype(*arrays):
    """float64 if any input is float64, else float32."""
    if any(a is not None and jnp.dtype(a.dtype) == jnp.float64 for a in arrays):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def _delta_step(s, q_t, k_t, v_t, g_t, b_t, scale):
    """One token of the recurrence. s [B, H, Dk, Dv]; q_t, k_t [B, H, Dk];
    v_t [B, H, Dv]; g_t, b_t [B, H]. Returns (S_t, o_t [B, H, Dv])."""
    s = jnp.exp(g_t)[..., None, None] * s
    pred = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision="highest")
    s = s + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * (v_t - pred),
                       precision="highest")
    o_t = scale * jnp.einsum("bhkv,bhk->bhv", s, q_t, precision="highest")
    return s, o_t


def token_scan(q, k, v, g, beta, scale, initial_state=None, segment_ids=None):
    """The contract's recurrence, one token at a time.

    q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None; segment_ids [B, T] integer or None
    (docs/contract.md section 6; may be traced). Returns (o [B, T, Hv, Dv] in
    v's dtype, final_state [B, Hv, Dk, Dv] in the compute dtype).
    """
    dt = compute_dtype(q, k, v, g, beta, initial_state)
    b, _, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // hk
    q = jnp.repeat(q.astype(dt), group, axis=2)
    k = jnp.repeat(k.astype(dt), group, axis=2)
    if initial_state is None:
        s0 = jnp.zeros((b, hv, dk, dv), dt)
    else:
        s0 = initial_state.astype(dt)
    xs = tuple(jnp.moveaxis(t.astype(dt), 1, 0) for t in (q, k, v, g, beta))
    s0, xs = align_varying(s0, xs)    # under jax.shard_map: one carry type

    if segment_ids is None:
        def step(s, x):
            return _delta_step(s, *x, scale)       # x: q_t, k_t, v_t, g_t, b_t
        s_final, o = lax.scan(step, s0, xs)
    else:
        s_final, o = _segment_token_scan(xs, s0, segment_ids, scale)
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), s_final


# ------------------------------------------------ segment_ids (contract §6)
# The deletion definition, token by token: a padding token (id 0) leaves the
# carry (state, conv history, id of the last document token) untouched and
# outputs 0; a document token whose id differs from the last document token's
# id starts a new document from a zero carry. Every per-token input is
# replaced by 0 at padding with jnp.where before use, so padding values (even
# inf/NaN) reach neither the outputs nor any gradient.

def _rows(mask, like):
    """Per-row mask [B] reshaped to broadcast against `like` [B, ...]."""
    return mask.reshape(mask.shape + (1,) * (jnp.ndim(like) - 1))


def _keep_rows(mask, x):
    """x where mask (per row), else exactly 0."""
    return jnp.where(_rows(mask, x), x, jnp.zeros_like(x))


def _segment_flags(id_t, last_id):
    """is_doc [B]: token t belongs to a document; starts_new [B]: it opens a
    document after an earlier one in its row (so the carry resets)."""
    is_doc = id_t > 0
    starts_new = is_doc & (last_id != 0) & (id_t != last_id)
    return is_doc, starts_new


def _segment_token_scan(xs, s0, segment_ids, scale):
    """token_scan's loop under segment_ids. xs: time-major (q, k, v, g, beta)
    with heads repeated; s0 [B, H, Dk, Dv]; segment_ids [B, T].
    Returns (final state, o [T, B, H, Dv])."""
    ids = jnp.moveaxis(jnp.asarray(segment_ids), 1, 0)          # [T, B]

    def step(carry, x):
        s, last_id = carry
        *tok, id_t = x
        is_doc, starts_new = _segment_flags(id_t, last_id)
        tok = [_keep_rows(is_doc, t) for t in tok]
        s_new, o_t = _delta_step(_keep_rows(~starts_new, s), *tok, scale)
        carry = (jnp.where(_rows(is_doc, s), s_new, s), jnp.where(is_doc, id_t, last_id))
        return carry, _keep_rows(is_doc, o_t)

    init, xs, ids = align_varying((s0, jnp.zeros_like(ids[0])), xs, ids)
    (s_final, _), o = lax.scan(step, init, (*xs, ids))
    return s_final, o


def reference_conv1d_silu(x, weight):
    """silu(causal depthwise conv) via lax.conv_general_dilated.
    x [B, T, C], weight [K, C] -> [B, T, C]."""
    width, channels = weight.shape
    kernel = weight[:, None, :]                    # [K, 1, C]  (W, I, O)
    pre = lax.conv_general_dilated(
        x, kernel, window_strides=(1,), padding=[(width - 1, 0)],
        dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=channels,
        precision=lax.Precision.HIGHEST)
    return pre * jax.nn.sigmoid(pre)


def _param_rank3(p):
    return p[None, None, :] if p.ndim == 1 else (p[:, None, :] if p.ndim == 2 else p)


def _conv1d_silu_valid(x, weight):
    """silu(depthwise conv) over the windows that fit, via
    lax.conv_general_dilated. x [B, K-1+T, C], weight [K, C] -> [B, T, C]."""
    kernel = weight[:, None, :]                    # [K, 1, C]  (W, I, O)
    pre = lax.conv_general_dilated(
        x, kernel, window_strides=(1,), padding="VALID",
        dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=weight.shape[1],
        precision=lax.Precision.HIGHEST)
    return pre * jax.nn.sigmoid(pre)


def reference_mixer(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads,
                    num_v_heads, head_k_dim, head_v_dim, use_qk_norm, eps,
                    scale, chunk_size=None, segment_ids=None, state=None,
                    return_state=False):
    """gdn_decoupled_conv1d by the contract's semantics, token scan inside.

    x [B, T, C]; conv_weight [K, C]; a, b [B, T, Hv]; a_log, dt_bias [Hv],
    [B', Hv] or [B', T', Hv]; segment_ids [B, T] integer or None (section 6;
    may be traced); state GDNState(conv [B, K-1, C], recurrent
    [B, Hv, Dk, Dv]) or None for zeros (section 7). Returns o [B, T, Hv, Dv]
    in x's dtype; with return_state, (o, GDNState(conv [B, K-1, C] in x's
    dtype, recurrent [B, Hv, Dk, Dv] in the compute dtype)).
    """
    del chunk_size  # the token scan has no chunks
    conv0, rec0 = (None, None) if state is None else (state.conv, state.recurrent)
    dt = compute_dtype(x, conv_weight, a, b, a_log, dt_bias, conv0, rec0)
    a_log3 = _param_rank3(a_log.astype(dt))
    dt_bias3 = _param_rank3(dt_bias.astype(dt))
    dims = (num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    bsz, t, c = x.shape
    x_dt, w = x.astype(dt), conv_weight.astype(dt)
    if conv0 is None:
        hist0 = jnp.zeros((bsz, w.shape[0] - 1, c), dt)
        s0 = jnp.zeros((bsz, num_v_heads, head_k_dim, head_v_dim), dt)
    else:
        hist0, s0 = conv0.astype(dt), rec0.astype(dt)
    if segment_ids is not None:
        o, (s_final, hist_final) = _segment_mixer_scan(
            x_dt, w, a.astype(dt), b.astype(dt), a_log3, dt_bias3, segment_ids,
            dims=dims, use_qk_norm=use_qk_norm, eps=eps, scale=scale, s0=s0,
            hist0=hist0)
    else:
        if state is None:     # zero history: the causal conv's own zero padding
            y = reference_conv1d_silu(x_dt, w)
        else:
            y = _conv1d_silu_valid(jnp.concatenate([hist0, x_dt], axis=1), w)
        nq = num_k_heads * head_k_dim
        q = y[..., :nq].reshape(bsz, t, num_k_heads, head_k_dim)
        k = y[..., nq:2 * nq].reshape(bsz, t, num_k_heads, head_k_dim)
        v = y[..., 2 * nq:].reshape(bsz, t, num_v_heads, head_v_dim)
        if use_qk_norm:
            q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + eps)
            k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + eps)
        g = -jnp.exp(a_log3) * jax.nn.softplus(a.astype(dt) + dt_bias3)
        beta = jax.nn.sigmoid(b.astype(dt))
        o, s_final = token_scan(q, k, v, g, beta, scale,
                                None if state is None else s0)
        # the last K-1 inputs of history-then-x (part of the history when T < K-1)
        hist_final = jnp.concatenate([hist0, x_dt], axis=1)[:, t:]
    o = o.astype(x.dtype)
    if not return_state:
        return o
    return o, GDNState(conv=hist_final.astype(x.dtype), recurrent=s_final)


def _mixer_token(window, w, a_t, b_t, a_log_t, dt_bias_t, *, dims, use_qk_norm, eps):
    """The mixer's per-token stages before the recurrence.

    window [B, K, C] (the K-1 previous document inputs, then x_t); w [K, C];
    a_t, b_t, a_log_t, dt_bias_t [B, Hv]. Returns q_t, k_t [B, Hv, Dk]
    (key heads repeated), v_t [B, Hv, Dv], g_t, beta_t [B, Hv].
    """
    hk, hv, dk, dv = dims
    bsz = window.shape[0]
    pre = jnp.sum(w * window, axis=1)                           # [B, C]
    y = pre * jax.nn.sigmoid(pre)
    nq = hk * dk
    q = y[:, :nq].reshape(bsz, hk, dk)
    k = y[:, nq:2 * nq].reshape(bsz, hk, dk)
    v = y[:, 2 * nq:].reshape(bsz, hv, dv)
    if use_qk_norm:
        q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + eps)
        k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + eps)
    g = -jnp.exp(a_log_t) * jax.nn.softplus(a_t + dt_bias_t)
    beta = jax.nn.sigmoid(b_t)
    return (jnp.repeat(q, hv // hk, axis=1), jnp.repeat(k, hv // hk, axis=1),
            v, g, beta)


def _segment_mixer_scan(x, w, a, b, a_log3, dt_bias3, segment_ids, *, dims,
                        use_qk_norm, eps, scale, s0, hist0):
    """The whole mixer under segment_ids, one token per scan step; the conv
    reads a carried history of the document's previous K-1 inputs.

    x [B, T, C]; w [K, C]; a, b [B, T, Hv]; a_log3, dt_bias3 rank 3,
    broadcastable to [B, T, Hv]; s0 [B, Hv, Dk, Dv] and hist0 [B, K-1, C]:
    the incoming carry of each row's first document; all in the compute
    dtype. Returns
    (o [B, T, Hv, Dv], (final state [B, Hv, Dk, Dv], conv history [B, K-1, C])).
    """
    hv = dims[1]
    bsz, t, _ = x.shape
    per_token = (x, a, b, jnp.broadcast_to(a_log3, (bsz, t, hv)),
                 jnp.broadcast_to(dt_bias3, (bsz, t, hv)))
    xs = tuple(jnp.moveaxis(u, 1, 0) for u in per_token)
    ids = jnp.moveaxis(jnp.asarray(segment_ids), 1, 0)          # [T, B]

    def step(carry, inp):
        s, hist, last_id = carry
        *tok, id_t = inp
        is_doc, starts_new = _segment_flags(id_t, last_id)
        x_t, a_t, b_t, a_log_t, dt_bias_t = [_keep_rows(is_doc, u) for u in tok]
        hist_in = _keep_rows(is_doc & ~starts_new, hist)    # 0: new document, or padding
        window = jnp.concatenate([hist_in, x_t[:, None]], axis=1)   # [B, K, C]
        qkvgb = _mixer_token(window, w, a_t, b_t, a_log_t, dt_bias_t, dims=dims,
                             use_qk_norm=use_qk_norm, eps=eps)
        s_new, o_t = _delta_step(_keep_rows(~starts_new, s), *qkvgb, scale)
        carry = (jnp.where(_rows(is_doc, s), s_new, s),
                 jnp.where(_rows(is_doc, hist), window[:, 1:], hist),
                 jnp.where(is_doc, id_t, last_id))
        return carry, _keep_rows(is_doc, o_t)

    init, xs, ids = align_varying((s0, hist0, jnp.zeros_like(ids[0])), xs, ids)
    (s_final, hist_final, _), o = lax.scan(step, init, (*xs, ids))
    return jnp.moveaxis(o, 0, 1), (s_final, hist_final)
