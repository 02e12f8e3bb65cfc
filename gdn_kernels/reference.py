"""The oracle: token-by-token gated delta rule and the whole GDN mixer in
plain JAX, differentiated by JAX autodiff.

Written independently of the kernels' stage files: the conv is
`lax.conv_general_dilated`, the norm, gates and recurrence follow the
contract's formulas line by line. It computes in float64 when the inputs are
float64 (enable x64), else in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def compute_dtype(*arrays):
    """float64 if any input is float64, else float32."""
    if any(a is not None and jnp.dtype(a.dtype) == jnp.float64 for a in arrays):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def token_scan(q, k, v, g, beta, scale, initial_state=None):
    """The contract's recurrence, one token at a time.

    q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None. Returns (o [B, T, Hv, Dv] in v's
    dtype, final_state [B, Hv, Dk, Dv] in the compute dtype).
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

    def step(s, x):
        q_t, k_t, v_t, g_t, b_t = x                # [B,H,Dk] [B,H,Dk] [B,H,Dv] [B,H] [B,H]
        s = jnp.exp(g_t)[..., None, None] * s
        pred = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision="highest")
        s = s + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * (v_t - pred),
                           precision="highest")
        o_t = scale * jnp.einsum("bhkv,bhk->bhv", s, q_t, precision="highest")
        return s, o_t

    s_final, o = lax.scan(step, s0, xs)
    return jnp.moveaxis(o, 0, 1).astype(v.dtype), s_final


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


def reference_mixer(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads,
                    num_v_heads, head_k_dim, head_v_dim, use_qk_norm, eps,
                    scale, chunk_size=None):
    """gdn_decoupled_conv1d by the contract's semantics, token scan inside."""
    del chunk_size  # the token scan has no chunks
    dt = compute_dtype(x, conv_weight, a, b, a_log, dt_bias)
    bsz, t, _ = x.shape
    y = reference_conv1d_silu(x.astype(dt), conv_weight.astype(dt))
    nq = num_k_heads * head_k_dim
    q = y[..., :nq].reshape(bsz, t, num_k_heads, head_k_dim)
    k = y[..., nq:2 * nq].reshape(bsz, t, num_k_heads, head_k_dim)
    v = y[..., 2 * nq:].reshape(bsz, t, num_v_heads, head_v_dim)
    if use_qk_norm:
        q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + eps)
        k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + eps)
    a_log3 = _param_rank3(a_log.astype(dt))
    dt_bias3 = _param_rank3(dt_bias.astype(dt))
    g = -jnp.exp(a_log3) * jax.nn.softplus(a.astype(dt) + dt_bias3)
    beta = jax.nn.sigmoid(b.astype(dt))
    o, _ = token_scan(q, k, v, g, beta, scale)
    return o.astype(x.dtype)
