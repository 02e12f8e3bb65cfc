"""A foreign target: the contract (sections 1-5) as a token-by-token scan in
float32 with plain JAX autodiff (no custom_vjp), written independently of
gdn_kernels' kernel math (only its input validation is reused).

Accepts float32 / bfloat16 activations, parameters and state; refuses
float64 with an error naming the argument (a TypeError that is also a
ValueError: float64 is a floating dtype, for which the contract names
ValueError). Everything is computed in float32; o comes back in v's / x's
dtype, final_state in float32, every cotangent in its primal's dtype (the
casts at the boundary do that under autodiff).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from gdn_kernels import validation

F32 = jnp.float32
HIGHEST = lax.Precision.HIGHEST


class Float64Rejected(TypeError, ValueError):
    """float64 input to a float32-only target."""


def reject_float64(**named):
    for name, x in named.items():
        if x is not None and jnp.dtype(x.dtype) == jnp.float64:
            raise Float64Rejected(f"{name} has dtype float64; this target computes in "
                                  f"float32 and accepts float32 or bfloat16 only")


# ------------------------------------------------------------------ math
def scan(q, k, v, g, beta, s0, scale):
    """The recurrence in float32. q, k [B,T,Hk,Dk]; v [B,T,Hv,Dv];
    g, beta [B,T,Hv]; s0 [B,Hv,Dk,Dv]. Returns (o [B,T,Hv,Dv], S_T)."""
    key_head = jnp.arange(v.shape[2]) // (v.shape[2] // q.shape[2])   # h -> h // G
    q, k = q[:, :, key_head], k[:, :, key_head]

    def step(s, inputs):
        q_t, k_t, v_t, g_t, b_t = inputs                     # [B,Hv,...] at time t
        s = s * jnp.exp(g_t)[:, :, None, None]               # S' = exp(g) S
        pred = jnp.einsum("bhkv,bhk->bhv", s, k_t, precision=HIGHEST)
        s = s + k_t[..., :, None] * (b_t[..., None] * (v_t - pred))[..., None, :]
        return s, scale * jnp.einsum("bhkv,bhk->bhv", s, q_t, precision=HIGHEST)

    s_last, o = lax.scan(step, s0, [jnp.swapaxes(a, 0, 1) for a in (q, k, v, g, beta)])
    return jnp.swapaxes(o, 0, 1), s_last


def l2norm_forward(x, eps):
    """x * rsqrt(sum(x^2, -1) + eps)."""
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def l2norm_backward(x, dy, eps):
    """VJP of l2norm_forward by autodiff."""
    return jax.vjp(lambda z: l2norm_forward(z, eps), x)[1](dy)[0]


def causal_conv_silu(x, w):
    """silu(sum_j w[j] * x[t - (K-1) + j]) with zeros before t = 0."""
    width, t = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
    pre = sum(w[j] * padded[:, j:j + t] for j in range(width))
    return pre * jax.nn.sigmoid(pre)


def as_rank3(p):
    """[Hv] -> [1,1,Hv]; [B',Hv] -> [B',1,Hv]; [B',T',Hv] as given."""
    return p.reshape((1, 1) + p.shape) if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)


def mixer(x, conv_weight, a, b, a_log, dt_bias, hk, hv, dk, dv, use_qk_norm, eps, scale):
    """The whole mixer in float32 (inputs already float32)."""
    bsz, t, _ = x.shape
    y = causal_conv_silu(x, conv_weight)
    q = y[..., :hk * dk].reshape(bsz, t, hk, dk)
    k = y[..., hk * dk:2 * hk * dk].reshape(bsz, t, hk, dk)
    v = y[..., 2 * hk * dk:].reshape(bsz, t, hv, dv)
    if use_qk_norm:
        q, k = l2norm_forward(q, eps), l2norm_forward(k, eps)
    g = -jnp.exp(as_rank3(a_log)) * jax.nn.softplus(a + as_rank3(dt_bias))
    beta = jax.nn.sigmoid(b)
    return scan(q, k, v, jnp.broadcast_to(g, a.shape), beta,
                jnp.zeros((bsz, hv, dk, dv), F32), scale)[0]


# ------------------------------------------------------------------ jitted entry points
def _f32(*arrays):     # autodiff casts each cotangent back to its primal's dtype
    return [a.astype(F32) for a in arrays]


@functools.lru_cache(maxsize=None)
def _delta_jit(scale):
    def run(q, k, v, g, beta, s0):
        o, s = scan(*_f32(q, k, v, g, beta, s0), scale)
        return o.astype(v.dtype), s.astype(jnp.promote_types(F32, v.dtype))
    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _mixer_jit(static):
    def run(x, conv_weight, a, b, a_log, dt_bias):
        return mixer(*_f32(x, conv_weight, a, b, a_log, dt_bias), *static).astype(x.dtype)
    return jax.jit(run)


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     chunk_size=64, impl=None, accept_float64=False):
    validation.validate_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                         chunk_size, impl or "reference")  # impl: ignored
    if not accept_float64:
        reject_float64(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if initial_state is None:
        initial_state = jnp.zeros((q.shape[0], v.shape[2], q.shape[3], v.shape[3]), F32)
    return _delta_jit(scale)(q, k, v, g, beta, initial_state)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                         head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                         chunk_size=64, impl=None, accept_float64=False):
    validation.validate_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                              head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size,
                              impl or "reference")   # any valid impl: always the scan
    if not accept_float64:
        reject_float64(x=x, conv_weight=conv_weight, a=a, b=b, a_log=a_log, dt_bias=dt_bias)
    scale = float(head_k_dim ** -0.5 if scale is None else scale)
    static = (int(num_k_heads), int(num_v_heads), int(head_k_dim), int(head_v_dim),
              bool(use_qk_norm), float(eps), scale)
    return _mixer_jit(static)(x, conv_weight, a, b, a_log, dt_bias)
