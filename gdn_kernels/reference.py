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

from typing import NamedTuple, Optional

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


class Rounding(NamedTuple):
    """A rounding model of a kernel that computes below the compute dtype
    (verification.tolerance.PRECISIONS): products: the dtype every
    product's operands and result are rounded to (None: not rounded);
    state: the dtype the state is rounded to after each update (None: kept
    in the compute dtype). Rounding is a cast there and back, so autodiff
    rounds the cotangents at the same places (a kernel whose backward
    computes in the same precision). The default rounds nothing: the oracle."""
    products: Optional[str] = None
    state: Optional[str] = None


EXACT = Rounding()


def _rounder(dtype: Optional[str]):
    """x -> x rounded to dtype and back (identity for None)."""
    if dtype is None:
        return lambda x: x
    return lambda x: x.astype(dtype).astype(x.dtype)


def _delta_step(s, q_t, k_t, v_t, g_t, b_t, scale, rounding=EXACT):
    """One token of the recurrence. s [B, H, Dk, Dv]; q_t, k_t [B, H, Dk];
    v_t [B, H, Dv]; g_t, b_t [B, H]. Returns (S_t, o_t [B, H, Dv]).
    rounding: where a lower-precision kernel rounds (Rounding)."""
    p, st = _rounder(rounding.products), _rounder(rounding.state)
    q_t, k_t, v_t = p(q_t), p(k_t), p(v_t)
    s = st(jnp.exp(g_t)[..., None, None] * s)
    pred = p(jnp.einsum("bhkv,bhk->bhv", p(s), k_t, precision="highest"))
    s = st(s + p(jnp.einsum("bhk,bhv->bhkv", k_t, p(b_t[..., None] * (v_t - pred)),
                            precision="highest")))
    o_t = p(scale * jnp.einsum("bhkv,bhk->bhv", p(s), q_t, precision="highest"))
    return s, o_t


def token_scan(q, k, v, g, beta, scale, initial_state=None, segment_ids=None,
               rounding=EXACT):
    """The contract's recurrence, one token at a time.

    q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None; segment_ids [B, T] integer or None
    (docs/contract.md section 6; may be traced); rounding: a lower-precision
    kernel's rounding model (Rounding; default none). Returns
    (o [B, T, Hv, Dv] in v's dtype, final_state [B, Hv, Dk, Dv] in the
    compute dtype).
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
            return _delta_step(s, *x, scale, rounding)   # x: q_t, k_t, v_t, g_t, b_t
        s_final, o = lax.scan(step, s0, xs)
    else:
        s_final, o = _segment_token_scan(xs, s0, segment_ids, scale, rounding)
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


def _segment_token_scan(xs, s0, segment_ids, scale, rounding=EXACT):
    """token_scan's loop under segment_ids. xs: time-major (q, k, v, g, beta)
    with heads repeated; s0 [B, H, Dk, Dv]; segment_ids [B, T].
    Returns (final state, o [T, B, H, Dv])."""
    ids = jnp.moveaxis(jnp.asarray(segment_ids), 1, 0)          # [T, B]

    def step(carry, x):
        s, last_id = carry
        *tok, id_t = x
        is_doc, starts_new = _segment_flags(id_t, last_id)
        tok = [_keep_rows(is_doc, t) for t in tok]
        s_new, o_t = _delta_step(_keep_rows(~starts_new, s), *tok, scale, rounding)
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
                    return_state=False, rounding=EXACT):
    """gdn_decoupled_conv1d by the contract's semantics: the layer
    (reference_layer), then the token scan.

    x [B, T, C]; conv_weight [K, C]; a, b [B, T, Hv]; a_log, dt_bias [Hv],
    [B', Hv] or [B', T', Hv]; segment_ids [B, T] integer or None (section 6;
    may be traced); state GDNState(conv [B, K-1, C], recurrent
    [B, Hv, Dk, Dv]) or None for zeros (section 7); rounding: the
    recurrence's rounding model (Rounding). Returns o [B, T, Hv, Dv]
    in x's dtype; with return_state, (o, GDNState(conv [B, K-1, C] in x's
    dtype, recurrent [B, Hv, Dk, Dv] in the compute dtype)).
    """
    del chunk_size  # the token scan has no chunks
    conv0, rec0 = (None, None) if state is None else (state.conv, state.recurrent)
    dt = compute_dtype(x, conv_weight, a, b, a_log, dt_bias, conv0, rec0)
    q, k, v, g, beta, hist_final = reference_layer(
        x, conv_weight, a, b, a_log, dt_bias, num_k_heads=num_k_heads,
        num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
        use_qk_norm=use_qk_norm, eps=eps, segment_ids=segment_ids, conv_state=conv0,
        dtype=dt)
    s0 = None if state is None else rec0.astype(dt)
    o, s_final = token_scan(q, k, v, g, beta, scale, s0, segment_ids, rounding)
    o = o.astype(x.dtype)
    if not return_state:
        return o
    return o, GDNState(conv=hist_final.astype(x.dtype), recurrent=s_final)


def reference_layer(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                    head_k_dim, head_v_dim, use_qk_norm, eps, segment_ids=None,
                    conv_state=None, dtype=None):
    """The mixer's stages before the recurrence, by the contract's formulas:
    causal depthwise conv + SiLU (over each document, reading conv_state
    before token 0), the q/k/v split, the optional QK L2 norm, the gates.

    x [B, T, C]; conv_weight [K, C]; a, b [B, T, Hv]; a_log, dt_bias [Hv],
    [B', Hv] or [B', T', Hv]; segment_ids [B, T] or None; conv_state
    [B, K-1, C] or None (zeros); dtype: the compute dtype (default: float64
    if any input is, else float32). Returns (q, k [B, T, Hk, Dk],
    v [B, T, Hv, Dv], g, beta [B, T, Hv], conv history [B, K-1, C]), all in
    the compute dtype; under segment_ids every padding position of q, k, v,
    g and beta is exactly 0 and no padding value reaches any of them.
    """
    dt = dtype or compute_dtype(x, conv_weight, a, b, a_log, dt_bias, conv_state)
    bsz, t, c = x.shape
    x_dt, w = x.astype(dt), conv_weight.astype(dt)
    hist0 = (jnp.zeros((bsz, w.shape[0] - 1, c), dt) if conv_state is None
             else conv_state.astype(dt))
    per_token = [a.astype(dt), b.astype(dt),
                 jnp.broadcast_to(_param_rank3(a_log.astype(dt)), a.shape),
                 jnp.broadcast_to(_param_rank3(dt_bias.astype(dt)), a.shape)]
    if segment_ids is not None:
        y, hist_final = _segment_conv_scan(x_dt, w, segment_ids, hist0)
        is_doc = (jnp.asarray(segment_ids) > 0)[..., None]
        per_token = [jnp.where(is_doc, u, jnp.zeros_like(u)) for u in per_token]
    else:
        if conv_state is None:   # zero history: the causal conv's own zero padding
            y = reference_conv1d_silu(x_dt, w)
        else:
            y = _conv1d_silu_valid(jnp.concatenate([hist0, x_dt], axis=1), w)
        # the last K-1 inputs of history-then-x (part of the history when T < K-1)
        hist_final = jnp.concatenate([hist0, x_dt], axis=1)[:, t:]
    nq = num_k_heads * head_k_dim
    q = y[..., :nq].reshape(bsz, t, num_k_heads, head_k_dim)
    k = y[..., nq:2 * nq].reshape(bsz, t, num_k_heads, head_k_dim)
    v = y[..., 2 * nq:].reshape(bsz, t, num_v_heads, head_v_dim)
    if use_qk_norm:
        q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + eps)
        k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + eps)
    a_dt, b_dt, a_log3, dt_bias3 = per_token
    g = -jnp.exp(a_log3) * jax.nn.softplus(a_dt + dt_bias3)
    beta = jax.nn.sigmoid(b_dt)
    return q, k, v, g, beta, hist_final


def _segment_conv_scan(x, w, segment_ids, hist0):
    """silu(conv) under segment_ids, one token per scan step: each window
    reads a carried history of the document's previous K-1 inputs (hist0
    for the row's first document, zeros for every later one).

    x [B, T, C] and w [K, C] in the compute dtype; segment_ids [B, T];
    hist0 [B, K-1, C]. Returns (y [B, T, C], exactly 0 at padding; the
    history after the row's last document [B, K-1, C]).
    """
    ids = jnp.moveaxis(jnp.asarray(segment_ids), 1, 0)          # [T, B]

    def step(carry, inp):
        hist, last_id = carry
        x_t, id_t = inp
        is_doc, starts_new = _segment_flags(id_t, last_id)
        hist_in = _keep_rows(is_doc & ~starts_new, hist)    # 0: new document, or padding
        window = jnp.concatenate([hist_in, _keep_rows(is_doc, x_t)[:, None]], axis=1)
        pre = jnp.sum(w * window, axis=1)                   # [B, C]
        carry = (jnp.where(_rows(is_doc, hist), window[:, 1:], hist),
                 jnp.where(is_doc, id_t, last_id))
        return carry, _keep_rows(is_doc, pre * jax.nn.sigmoid(pre))

    xs = jnp.moveaxis(x, 1, 0)
    init, xs, ids = align_varying((hist0, jnp.zeros_like(ids[0])), xs, ids)
    (hist_final, _), y = lax.scan(step, init, (xs, ids))
    return jnp.moveaxis(y, 0, 1), hist_final
