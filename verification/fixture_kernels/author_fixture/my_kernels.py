"""A kernel author's own module, as docs/kernel-authors.md writes it: the
contract's core op and mixer as a float32 token scan with plain JAX
autodiff, and a declaration of what it supports (no packed rows, no
carried state, no input validation). Used by verification/tests/test_kernel_author.py
from a directory outside this repository."""

import jax
import jax.numpy as jnp

from verification import KernelDeclaration, Supports


def l2norm_forward(x, eps):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def l2norm_backward(x, dy, eps):
    return jax.vjp(lambda z: l2norm_forward(z, eps), x)[1](dy)[0]


def _scan(q, k, v, g, beta, state, scale):
    """q, k [B,T,Hk,Dk]; v [B,T,Hv,Dv]; g, beta [B,T,Hv]; state [B,Hv,Dk,Dv]."""
    group = v.shape[2] // q.shape[2]
    q, k = jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2)

    def step(s, t):
        q_t, k_t, v_t, g_t, b_t = t
        s = s * jnp.exp(g_t)[..., None, None]
        err = v_t - jnp.einsum("bhkv,bhk->bhv", s, k_t, precision="highest")
        s = s + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * err, precision="highest")
        return s, scale * jnp.einsum("bhkv,bhk->bhv", s, q_t, precision="highest")

    xs = [jnp.moveaxis(a.astype(jnp.float32), 1, 0) for a in (q, k, v, g, beta)]
    state, o = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(o, 0, 1), state


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, chunk_size=64):
    b, _, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    scale = dk ** -0.5 if scale is None else scale
    state = (jnp.zeros((b, hv, dk, dv), jnp.float32) if initial_state is None
             else initial_state.astype(jnp.float32))
    o, state = _scan(q, k, v, g, beta, state, scale)
    return o.astype(v.dtype), state


def _rank3(p):
    return p[None, None] if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                         head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                         chunk_size=64):
    f32 = jnp.float32
    bsz, t, _ = x.shape
    width = conv_weight.shape[0]
    xp = jnp.pad(x.astype(f32), ((0, 0), (width - 1, 0), (0, 0)))
    pre = sum(conv_weight[j].astype(f32) * xp[:, j:j + t] for j in range(width))
    y = pre * jax.nn.sigmoid(pre)
    qk = num_k_heads * head_k_dim
    q = y[..., :qk].reshape(bsz, t, num_k_heads, head_k_dim)
    k = y[..., qk:2 * qk].reshape(bsz, t, num_k_heads, head_k_dim)
    v = y[..., 2 * qk:].reshape(bsz, t, num_v_heads, head_v_dim)
    if use_qk_norm:
        q, k = l2norm_forward(q, eps), l2norm_forward(k, eps)
    g = -jnp.exp(_rank3(a_log.astype(f32))) * jax.nn.softplus(
        a.astype(f32) + _rank3(dt_bias.astype(f32)))
    beta = jax.nn.sigmoid(b.astype(f32))
    scale = head_k_dim ** -0.5 if scale is None else scale
    state = jnp.zeros((bsz, num_v_heads, head_k_dim, head_v_dim), f32)
    o, _ = _scan(q, k, v, jnp.broadcast_to(g, a.shape), beta, state, scale)
    return o.astype(x.dtype)


GDN_KERNEL = KernelDeclaration(
    gated_delta_rule=gated_delta_rule,
    gdn_decoupled_conv1d=gdn_decoupled_conv1d,
    l2norm_forward=l2norm_forward,
    l2norm_backward=l2norm_backward,
    supports=Supports(segment_ids=False, carried_state=False, validates_input=False))
