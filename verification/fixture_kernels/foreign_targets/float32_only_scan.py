"""A foreign target: the contract (sections 1-7) as a token-by-token scan in
float32 with plain JAX autodiff (no custom_vjp), written independently of
gdn_kernels' kernel math (only its input validation is reused).

Packed rows (segment_ids, section 6) run through separate scans that carry
masks: a padding token is a skipped step (state and conv history selected
unchanged with jnp.where, output 0, its inputs replaced by zeros with
jnp.where, so its cotangents are exactly 0), and a document start selects a
zero state / zero conv history before its step. segment_ids=None runs the
unmasked scans.

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

from gdn_kernels import GDNState, validation

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


def causal_conv_silu(x, w, history=None):
    """silu(sum_j w[j] * x[t - (K-1) + j]) with history [B, K-1, C] before
    t = 0 (None: zeros)."""
    width, t = w.shape[0], x.shape[1]
    if history is None:
        padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
    else:
        padded = jnp.concatenate([history, x], axis=1)
    pre = sum(w[j] * padded[:, j:j + t] for j in range(width))
    return pre * jax.nn.sigmoid(pre)


def as_rank3(p):
    """[Hv] -> [1,1,Hv]; [B',Hv] -> [B',1,Hv]; [B',T',Hv] as given."""
    return p.reshape((1, 1) + p.shape) if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)


def split_heads(y, hk, hv, dk, dv, use_qk_norm, eps):
    """The conv output y [B, T, C] as q, k [B, T, Hk, Dk] (L2-normalised
    when use_qk_norm) and v [B, T, Hv, Dv]."""
    bsz, t, _ = y.shape
    q = y[..., :hk * dk].reshape(bsz, t, hk, dk)
    k = y[..., hk * dk:2 * hk * dk].reshape(bsz, t, hk, dk)
    v = y[..., 2 * hk * dk:].reshape(bsz, t, hv, dv)
    if use_qk_norm:
        q, k = l2norm_forward(q, eps), l2norm_forward(k, eps)
    return q, k, v


def gates(a, b, a_log, dt_bias):
    """(g, beta) [B, T, Hv]: g = -exp(a_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    g = -jnp.exp(as_rank3(a_log)) * jax.nn.softplus(a + as_rank3(dt_bias))
    return jnp.broadcast_to(g, a.shape), jax.nn.sigmoid(b)


def mixer(x, conv_weight, a, b, a_log, dt_bias, hk, hv, dk, dv, use_qk_norm, eps, scale):
    """The whole mixer in float32 (inputs already float32)."""
    q, k, v = split_heads(causal_conv_silu(x, conv_weight), hk, hv, dk, dv, use_qk_norm, eps)
    g, beta = gates(a, b, a_log, dt_bias)
    return scan(q, k, v, g, beta, jnp.zeros((x.shape[0], hv, dk, dv), F32), scale)[0]


# ------------------------------------------------------------------ packed rows (section 6)
def packing_masks(ids):
    """(real, start), each [B,T] bool, from segment_ids [B,T]: real marks a
    non-padding token; start marks a real token whose nearest earlier real
    token has another id (a row's first real token is no start: the first
    document continues the incoming state)."""
    real = ids != 0
    pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    last_real = lax.cummax(jnp.where(real, pos, -1), axis=1)            # <= t
    before = jnp.pad(last_real[:, :-1], ((0, 0), (1, 0)), constant_values=-1)  # < t
    prev_id = jnp.take_along_axis(ids, jnp.maximum(before, 0), axis=1)
    return real, real & (before >= 0) & (prev_id != ids)


def keep_real(x, real):
    """x [B,T,...] with every padding token's entries replaced by zeros (a
    select: the cotangent at padding is exactly 0 whatever x holds there)."""
    return jnp.where(real.reshape(real.shape + (1,) * (x.ndim - 2)), x, jnp.zeros((), x.dtype))


def packed_scan(q, k, v, g, beta, s0, scale, real, start):
    """scan() on packed rows: padding steps leave S as it is and emit 0;
    a document start replaces the carried S with zeros first."""
    key_head = jnp.arange(v.shape[2]) // (v.shape[2] // q.shape[2])
    q, k, v, g, beta = (keep_real(a, real) for a in (q[:, :, key_head], k[:, :, key_head],
                                                      v, g, beta))

    def step(s, inputs):
        q_t, k_t, v_t, g_t, b_t, real_t, start_t = inputs
        s_in = jnp.where(start_t[:, None, None, None], jnp.zeros((), s.dtype), s)
        s_dec = s_in * jnp.exp(g_t)[:, :, None, None]
        pred = jnp.einsum("bhkv,bhk->bhv", s_dec, k_t, precision=HIGHEST)
        s_new = s_dec + k_t[..., :, None] * (b_t[..., None] * (v_t - pred))[..., None, :]
        o_t = scale * jnp.einsum("bhkv,bhk->bhv", s_new, q_t, precision=HIGHEST)
        return (jnp.where(real_t[:, None, None, None], s_new, s),
                jnp.where(real_t[:, None, None], o_t, jnp.zeros((), o_t.dtype)))

    xs = [jnp.swapaxes(a, 0, 1) for a in (q, k, v, g, beta, real, start)]
    s_last, o = lax.scan(step, s0, xs)
    return jnp.swapaxes(o, 0, 1), s_last


def packed_causal_conv_silu(x, w, real, start, hist0):
    """causal_conv_silu on packed rows, as a scan carrying the last K-1 real
    inputs of the current document from hist0 [B, K-1, C]: padding neither
    reads nor shifts the history (its y is 0); a document start clears it.
    Returns (y, the history after the row)."""
    width = w.shape[0]
    x = keep_real(x, real)

    def step(hist, inputs):                      # hist [B, K-1, C]
        x_t, real_t, start_t = inputs
        hist_in = jnp.where(start_t[:, None, None], jnp.zeros((), hist.dtype), hist)
        window = jnp.concatenate([hist_in, x_t[:, None]], axis=1)        # [B, K, C]
        pre = sum(w[j] * window[:, j] for j in range(width))
        y_t = jnp.where(real_t[:, None], pre * jax.nn.sigmoid(pre), jnp.zeros((), pre.dtype))
        return jnp.where(real_t[:, None, None], window[:, 1:], hist), y_t

    hist, y = lax.scan(step, hist0, [jnp.swapaxes(a, 0, 1) for a in (x, real, start)])
    return jnp.swapaxes(y, 0, 1), hist


def packed_mixer(x, conv_weight, a, b, a_log, dt_bias, ids, hist0, s0, hk, hv, dk, dv,
                 use_qk_norm, eps, scale):
    """mixer() on packed rows (inputs already float32) from the carried conv
    history hist0 [B, K-1, C] and state s0 [B, Hv, Dk, Dv] (section 7).
    Every per-token input, the broadcast gate parameters included, is
    zeroed at padding by a select before use, so padding cotangents are
    exactly 0. Returns (o, conv history, state) after the row."""
    real, start = packing_masks(ids)
    y, hist = packed_causal_conv_silu(x, conv_weight, real, start, hist0)
    q, k, v = split_heads(y, hk, hv, dk, dv, use_qk_norm, eps)
    a_log3 = keep_real(jnp.broadcast_to(as_rank3(a_log), a.shape), real)
    dt_bias3 = keep_real(jnp.broadcast_to(as_rank3(dt_bias), a.shape), real)
    g = -jnp.exp(a_log3) * jax.nn.softplus(keep_real(a, real) + dt_bias3)
    beta = jax.nn.sigmoid(keep_real(b, real))
    o, s_last = packed_scan(q, k, v, g, beta, s0, scale, real, start)
    return o, hist, s_last


# ------------------------------------------------------------------ jitted entry points
def _f32(*arrays):     # autodiff casts each cotangent back to its primal's dtype
    return [a.astype(F32) for a in arrays]


@functools.lru_cache(maxsize=None)
def _delta_jit(scale):
    def run(q, k, v, g, beta, s0, ids):
        if ids is None:
            o, s = scan(*_f32(q, k, v, g, beta, s0), scale)
        else:
            o, s = packed_scan(*_f32(q, k, v, g, beta, s0), scale, *packing_masks(ids))
        return o.astype(v.dtype), s.astype(jnp.promote_types(F32, v.dtype))
    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _mixer_jit(static):
    """(o, GDNState or None): carried state (section 7) runs the packed scans
    (all-ones ids when segment_ids is None), which carry the conv history."""
    hk, hv, dk, dv = static[:4]

    def run(x, conv_weight, a, b, a_log, dt_bias, ids, state, return_state):
        if ids is None and state is None and not return_state:
            return mixer(*_f32(x, conv_weight, a, b, a_log, dt_bias), *static).astype(x.dtype), None
        bsz, _, c = x.shape
        if state is None:
            hist0 = jnp.zeros((bsz, conv_weight.shape[0] - 1, c), F32)
            s0 = jnp.zeros((bsz, hv, dk, dv), F32)
        else:
            hist0, s0 = _f32(state.conv, state.recurrent)
        ids = jnp.ones(x.shape[:2], jnp.int32) if ids is None else ids
        o, hist, s_last = packed_mixer(*_f32(x, conv_weight, a, b, a_log, dt_bias), ids,
                                       hist0, s0, *static)
        rec_dtype = jnp.promote_types(F32, x.dtype)
        return o.astype(x.dtype), GDNState(hist.astype(x.dtype), s_last.astype(rec_dtype))
    return jax.jit(run, static_argnums=(8,))


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     segment_ids=None, chunk_size=64, impl=None, accept_float64=False):
    validation.validate_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                         chunk_size, impl or "reference",  # impl: ignored
                                         segment_ids=segment_ids)
    if not accept_float64:
        reject_float64(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if initial_state is None:
        initial_state = jnp.zeros((q.shape[0], v.shape[2], q.shape[3], v.shape[3]), F32)
    return _delta_jit(scale)(q, k, v, g, beta, initial_state, segment_ids)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                         head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                         segment_ids=None, chunk_size=64, impl=None, state=None,
                         return_state=False, accept_float64=False):
    validation.validate_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                              head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size,
                              impl or "reference",   # any valid impl: always the scan
                              segment_ids=segment_ids, state=state,
                              return_state=return_state)
    if not accept_float64:
        reject_float64(x=x, conv_weight=conv_weight, a=a, b=b, a_log=a_log, dt_bias=dt_bias,
                       **({} if state is None else {"state.conv": state.conv,
                                                    "state.recurrent": state.recurrent}))
    scale = float(head_k_dim ** -0.5 if scale is None else scale)
    static = (int(num_k_heads), int(num_v_heads), int(head_k_dim), int(head_v_dim),
              bool(use_qk_norm), float(eps), scale)
    state = None if state is None else GDNState(*state)
    o, new_state = _mixer_jit(static)(x, conv_weight, a, b, a_log, dt_bias, segment_ids,
                                      state, bool(return_state))
    return (o, new_state) if return_state else o
