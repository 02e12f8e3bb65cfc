"""A GDN layer in Qwen3-Next's layer conventions, written without
gdn_kernels or verification: the fused projection grouped per key head
(its q, its k, then the v of its value heads), one causal depthwise conv
over it (weight [C, K], no bias), the QK L2 norm by argument, the gates
from A_log and dt_bias, the chunked (WY) gated delta rule, o returned
head-first [B, Hv, T, Dv] and the recurrent state stored [B, Hv, Dv, Dk].
One `jax.custom_vjp` over the whole layer: the conv, SiLU, QK-norm and gate
backwards are written by hand; the recurrence's backward is the autodiff of
its own chunked forward.

    o = gdn_layer(mixed_qkv, conv1d_weight, a, b, A_log, dt_bias, *,
                  n_k_heads, n_v_heads, k_dim, v_dim, chunk_size=64,
                  use_qk_l2norm=True, qk_eps=1e-6, scale=None, cache=None,
                  return_cache=False)

mixed_qkv [B, T, C], per key head h: q_h [Dk], k_h [Dk], then v of the
value heads h*G .. h*G+G-1 [G*Dv] (G = Hv / Hk); conv1d_weight [C, K];
a, b [B, T, Hv]; A_log, dt_bias [Hv], [B|1, Hv] or [B|1, T|1, Hv]; cache
(conv [B, K-1, C] in mixed_qkv's channel order, recurrent [B, Hv, Dv, Dk])
or None (zeros). Returns o [B, Hv, T, Dv], and with return_cache
(o, cache after the call). Computes in float32 (float64 for float64
inputs); o and the conv cache in mixed_qkv's dtype, the recurrent cache
float32, each gradient in its primal's dtype. T need not be a multiple of
the chunk size (the last chunk is padded with identity steps).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _compute_dtype(*xs):
    return jnp.float64 if any(x.dtype == jnp.float64 for x in xs) else jnp.float32


# ----------------------------------------------------------- conv + SiLU

def conv_forward(xp, w, tokens):
    """xp [B, K-1+T, C] (cache then inputs), w [C, K] -> pre-activation [B, T, C]."""
    return sum(w[:, j] * xp[:, j:j + tokens] for j in range(w.shape[1]))


def conv_backward(xp, w, dpre):
    """Cotangents of conv_forward: (dxp [B, K-1+T, C], dw [C, K])."""
    width, tokens = w.shape[1], dpre.shape[1]
    dw = jnp.stack([jnp.sum(dpre * xp[:, j:j + tokens], axis=(0, 1)) for j in range(width)],
                   axis=1)
    dxp = jnp.zeros_like(xp)
    for j in range(width):
        dxp = dxp.at[:, j:j + tokens].add(w[:, j] * dpre)
    return dxp, dw


def silu_backward(pre, dy):
    s = jax.nn.sigmoid(pre)
    return dy * (s + pre * s * (1 - s))


# ----------------------------------------------------------- QK L2 norm

def l2norm(x, eps):
    return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


def l2norm_backward(x, dy, eps):
    """d/dx of x * rsqrt(|x|^2 + eps): r (dy - y (y . dy)), y = x r."""
    r = jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)
    y = x * r
    return r * (dy - y * jnp.sum(y * dy, -1, keepdims=True))


# ----------------------------------------------------------- gates

def per_token(p, shape):
    """A_log / dt_bias [Hv], [B', Hv] or [B', T', Hv] broadcast to [B, T, Hv]."""
    if p.ndim == 2:
        p = p[:, None]
    return jnp.broadcast_to(p, shape)


def sum_to_param(full, p):
    """A [B, T, Hv] cotangent summed back to p's shape."""
    if p.ndim == 1:
        return jnp.sum(full, axis=(0, 1))
    p3 = p[:, None] if p.ndim == 2 else p
    axes = tuple(i for i in range(2) if p3.shape[i] == 1 and full.shape[i] != 1)
    return jnp.sum(full, axis=axes, keepdims=True).reshape(p.shape)


def gates_backward(a, b, a_log, dt_bias, dg, dbeta):
    """(da, db, dA_log, ddt_bias) of g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b)."""
    u = a + per_token(dt_bias, a.shape)
    rate = jnp.exp(per_token(a_log, a.shape))
    du = -rate * jax.nn.sigmoid(u) * dg
    beta = jax.nn.sigmoid(b)
    return (du, dbeta * beta * (1 - beta), sum_to_param(-rate * jax.nn.softplus(u) * dg, a_log),
            sum_to_param(du, dt_bias))


# ----------------------------------------------------------- the chunked recurrence

def _between(c, dtype):
    """[C, C, C]: [i, j, s] = 1 where j < s <= i (the steps from j to i)."""
    i, j, s = (jnp.arange(c).reshape(shape) for shape in ((c, 1, 1), (1, c, 1), (1, 1, c)))
    return ((j < s) & (s <= i)).astype(dtype)


def _unit_lower_solve(a, r):
    """(I + a) u = r for a [..., C, C] strictly lower, r [..., C, D], by
    forward substitution (one row a step)."""
    def row(i, u):
        return u.at[..., i, :].set(r[..., i, :] - jnp.einsum("...j,...jd->...d", a[..., i, :], u))
    return jax.lax.fori_loop(0, r.shape[-2], row, jnp.zeros_like(r))


def _chunk(state, chunk, scale):
    """One chunk, every batch row and head at once. state [B, H, Dk, Dv];
    chunk (q, k [B, H, C, Dk], v [B, H, C, Dv], g, beta [B, H, C])."""
    q, k, v, g, beta = chunk
    c = g.shape[-1]
    cum = jnp.cumsum(g, -1)                                          # G_i
    pair = jnp.einsum("ijs,bhs->bhij", _between(c, g.dtype), g)      # G_i - G_j, summed
    lower = jnp.tril(jnp.ones((c, c), bool))
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, pair, 0.0)), 0.0)
    strict = decay * (1 - jnp.eye(c, dtype=g.dtype))
    a = beta[..., None] * strict * jnp.einsum("bhid,bhjd->bhij", k, k)
    rhs = beta[..., None] * (v - jnp.exp(cum)[..., None] * jnp.einsum("bhid,bhdv->bhiv", k, state))
    u = _unit_lower_solve(a, rhs)
    o = scale * (jnp.exp(cum)[..., None] * jnp.einsum("bhid,bhdv->bhiv", q, state)
                 + jnp.einsum("bhij,bhjv->bhiv", decay * jnp.einsum("bhid,bhjd->bhij", q, k), u))
    # G_last - G_j = g_{j+1} + ... + g_last, summed as such: the difference of
    # two cumulative sums would cancel under strong decay (an error of
    # ulp(|g_j|) in the exponent)
    after = jnp.flip(jnp.cumsum(jnp.flip(g, -1), -1), -1)[..., 1:]
    tail = jnp.concatenate([after, jnp.zeros_like(g[..., :1])], -1)
    new = (jnp.exp(cum[..., -1])[..., None, None] * state
           + jnp.einsum("bhj,bhjd,bhjv->bhdv", jnp.exp(tail), k, u))
    return new, o


def chunked_delta_rule(q, k, v, g, beta, h0, scale, chunk_size):
    """q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv], h0
    [B, Hv, Dk, Dv] -> (o [B, T, Hv, Dv], final state)."""
    group = v.shape[2] // q.shape[2]
    q, k = jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2)
    bsz, tokens, heads = g.shape
    n = -(-tokens // chunk_size)
    pad = n * chunk_size - tokens       # identity steps: g = 0, beta = 0, q = k = v = 0

    def chunks(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape((bsz, n, chunk_size) + x.shape[2:])
        return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)        # [N, B, H, C, ...]

    final, o = jax.lax.scan(lambda s, c: _chunk(s, c, scale), h0,
                            tuple(map(chunks, (q, k, v, g, beta))))
    o = jnp.moveaxis(jnp.moveaxis(o, 2, 3), 0, 1).reshape(bsz, n * chunk_size, heads, -1)
    return o[:, :tokens], final


# ----------------------------------------------------------- the layer

def _ungroup(y, dims):
    """y [B, T, C] in the grouped channel order -> q, k [B, T, Hk, Dk], v [B, T, Hv, Dv]."""
    hk, hv, dk, dv = dims[:4]
    per_head = y.reshape(y.shape[:2] + (hk, 2 * dk + (hv // hk) * dv))
    v = per_head[..., 2 * dk:].reshape(y.shape[:2] + (hv, dv))
    return per_head[..., :dk], per_head[..., dk:2 * dk], v


def _regroup(dq, dk_, dv, dims):
    """The inverse of _ungroup: [B, T, C] in the grouped channel order."""
    hk, hv = dims[:2]
    bt = dq.shape[:2]
    dv = dv.reshape(bt + (hk, -1))
    return jnp.concatenate([dq, dk_, dv], axis=-1).reshape(bt + (-1,))


def _forward(dims, x, w, a, b, a_log, dt_bias, conv_cache, h0):
    hk, hv, dk, dv, scale, chunk, use_norm, eps = dims
    xp = jnp.concatenate([conv_cache, x], axis=1)
    pre = conv_forward(xp, w, x.shape[1])
    q_raw, k_raw, v = _ungroup(pre * jax.nn.sigmoid(pre), dims)
    q, k = (l2norm(q_raw, eps), l2norm(k_raw, eps)) if use_norm else (q_raw, k_raw)
    u = a + per_token(dt_bias, a.shape)
    g = -jnp.exp(per_token(a_log, a.shape)) * jax.nn.softplus(u)
    beta = jax.nn.sigmoid(b)
    o, final = chunked_delta_rule(q, k, v, g, beta, h0, scale, chunk)
    return o, final, (xp, pre, q_raw, k_raw, q, k, v, g, beta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(dims, x, w, a, b, a_log, dt_bias, conv_cache, h0):
    return _layer_fwd(dims, x, w, a, b, a_log, dt_bias, conv_cache, h0)[0]


def _layer_fwd(dims, x, w, a, b, a_log, dt_bias, conv_cache, h0):
    o, final, saved = _forward(dims, x, w, a, b, a_log, dt_bias, conv_cache, h0)
    xp, width = saved[0], w.shape[1]
    return (o, xp[:, xp.shape[1] - (width - 1):], final), (w, a, b, a_log, dt_bias, h0, saved)


def _layer_bwd(dims, res, cts):
    hk, hv, dk, dv, scale, chunk, use_norm, eps = dims
    w, a, b, a_log, dt_bias, h0, (xp, pre, q_raw, k_raw, q, k, v, g, beta) = res
    do, dcache, dfinal = cts
    _, recurrence_vjp = jax.vjp(lambda *t: chunked_delta_rule(*t, scale, chunk),
                                q, k, v, g, beta, h0)
    dq, dk_, dv_, dg, dbeta, dh0 = recurrence_vjp((do, dfinal))
    da, db, da_log, ddt_bias = gates_backward(a, b, a_log, dt_bias, dg, dbeta)
    if use_norm:
        dq, dk_ = l2norm_backward(q_raw, dq, eps), l2norm_backward(k_raw, dk_, eps)
    dxp, dw = conv_backward(xp, w, silu_backward(pre, _regroup(dq, dk_, dv_, dims)))
    width = w.shape[1]
    dxp = dxp.at[:, xp.shape[1] - (width - 1):].add(dcache)
    return dxp[:, width - 1:], dw, da, db, da_log, ddt_bias, dxp[:, :width - 1], dh0


_layer.defvjp(_layer_fwd, _layer_bwd)


def gdn_layer(mixed_qkv, conv1d_weight, a, b, A_log, dt_bias, *, n_k_heads, n_v_heads, k_dim,
              v_dim, chunk_size=64, use_qk_l2norm=True, qk_eps=1e-6, scale=None, cache=None,
              return_cache=False):
    """The layer (module docstring): o [B, Hv, T, Dv], and the cache with return_cache."""
    primals = (mixed_qkv, conv1d_weight, a, b, A_log, dt_bias)
    dt = _compute_dtype(*primals)
    bsz, width = mixed_qkv.shape[0], conv1d_weight.shape[1]
    if cache is None:
        conv_cache = jnp.zeros((bsz, width - 1, mixed_qkv.shape[-1]), dt)
        h0 = jnp.zeros((bsz, n_v_heads, k_dim, v_dim), dt)
    else:
        conv_cache, h0 = cache[0].astype(dt), jnp.swapaxes(cache[1], -1, -2).astype(dt)
    dims = (n_k_heads, n_v_heads, k_dim, v_dim, k_dim ** -0.5 if scale is None else scale,
            chunk_size, use_qk_l2norm, qk_eps)
    o, conv_out, final = _layer(dims, *(t.astype(dt) for t in primals), conv_cache, h0)
    o = jnp.swapaxes(o, 1, 2).astype(mixed_qkv.dtype)
    if not return_cache:
        return o
    return o, (conv_out.astype(mixed_qkv.dtype), jnp.swapaxes(final, -1, -2).astype(jnp.float32))
