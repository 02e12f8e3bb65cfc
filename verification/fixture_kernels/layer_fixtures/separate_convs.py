"""A GDN layer in flash-linear-attention's layer conventions, written
without gdn_kernels or verification: separate q, k and v projections, each
with its own causal depthwise conv (torch's Conv1d weight [C, 1, K] and a
bias), conv states [B, C, K-1], the QK L2 norm always on (eps 1e-6), the
gates from A_log and dt_bias, a token scan of the gated delta rule, and o
returned flat [B, T, Hv*Dv]. One `jax.custom_vjp` over the whole layer:
the conv, SiLU, QK-norm and gate backwards are written by hand; the
recurrence's backward is the autodiff of its own scan.

    o, final = gated_deltanet(q_in, k_in, v_in, a, b, q_conv, k_conv, v_conv,
                              q_bias, k_bias, v_bias, A_log, dt_bias, *,
                              num_heads, num_v_heads, head_dim, head_v_dim,
                              scale=None, initial_state=None,
                              output_final_state=False)

q_in, k_in [B, T, H*Dk], v_in [B, T, Hv*Dv]; *_conv [C, 1, K]; *_bias [C];
a, b [B, T, Hv]; A_log, dt_bias [Hv], [B|1, Hv] or [B|1, T|1, Hv];
initial_state ((q, k, v conv states [B, C, K-1]), recurrent [B, Hv, Dk, Dv])
or None (zeros). Value head h reads key head h // (Hv / H). Returns
(o [B, T, Hv*Dv], the final state in initial_state's structure, or None
unless output_final_state). Computes in float32 (float64 for float64
inputs); o and the conv states in q_in's dtype, the recurrent state
float32, each gradient in its primal's dtype.

verification/tests/test_layer_adapter.py declares it with
verification.adapt_mixer and plants the review's kinds of bugs into copies
of this file's text.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

QK_NORM_EPS = 1e-6
QK_NORM_BWD_EPS = 1e-6


def _compute_dtype(*xs):
    return jnp.float64 if any(x.dtype == jnp.float64 for x in xs) else jnp.float32


# ----------------------------------------------------------- conv + SiLU

def history_then_inputs(state, x):
    """state [B, C, K-1], x [B, T, C] -> [B, K-1+T, C]."""
    return jnp.concatenate([jnp.swapaxes(state, 1, 2), x], axis=1)


def conv_forward(xp, w, bias, tokens):
    """xp [B, K-1+T, C] (history then inputs), w [C, 1, K], bias [C] ->
    pre-activation [B, T, C]."""
    return bias + sum(w[:, 0, j] * xp[:, j:j + tokens] for j in range(w.shape[-1]))


def conv_backward(xp, w, dpre):
    """Cotangents of conv_forward: (dxp [B, K-1+T, C], dw [C, 1, K], dbias [C])."""
    width, tokens = w.shape[-1], dpre.shape[1]
    dw_kc = jnp.stack([jnp.sum(dpre * xp[:, j:j + tokens], axis=(0, 1)) for j in range(width)])
    dw = jnp.transpose(dw_kc)[:, None, :]
    dxp = jnp.zeros_like(xp)
    for j in range(width):
        dxp = dxp.at[:, j:j + tokens].add(w[:, 0, j] * dpre)
    return dxp, dw, jnp.sum(dpre, axis=(0, 1))


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

def as_rank3(p):
    """A_log / dt_bias [Hv] -> [1, 1, Hv]; [B', Hv] -> [B', 1, Hv]; rank 3 as is."""
    if p.ndim == 1:
        return p[None, None]
    return p[:, None] if p.ndim == 2 else p


def reduce_to_param(full, p):
    """A [B, T, Hv] cotangent summed over the axes p was broadcast along,
    in p's shape."""
    p3 = as_rank3(p)
    axes = tuple(i for i in range(3) if p3.shape[i] == 1 and full.shape[i] != 1)
    return jnp.sum(full, axis=axes, keepdims=True).reshape(p.shape)


def gates(a, b, a_log, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b): [B, T, Hv]."""
    u = a + as_rank3(dt_bias)
    return -jnp.exp(as_rank3(a_log)) * jax.nn.softplus(u), jax.nn.sigmoid(b)


def gates_backward(a, b, a_log, dt_bias, dg, dbeta):
    """(da, db, dA_log, ddt_bias) of gates."""
    u = a + as_rank3(dt_bias)
    decay_rate = jnp.exp(as_rank3(a_log))
    du = -decay_rate * jax.nn.sigmoid(u) * dg
    da_log_full = -decay_rate * jax.nn.softplus(u) * dg
    beta = jax.nn.sigmoid(b)
    return (du, dbeta * beta * (1 - beta), reduce_to_param(da_log_full, a_log),
            reduce_to_param(du, dt_bias))


# ----------------------------------------------------------- the recurrence

def delta_rule_scan(q, k, v, g, beta, h0, scale):
    """q, k [B, T, H, Dk], v [B, T, Hv, Dv], g, beta [B, T, Hv], h0
    [B, Hv, Dk, Dv] -> (o [B, T, Hv, Dv], final state), one token a step."""
    group = v.shape[2] // q.shape[2]
    q, k = jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2)

    def step(h, xs):
        q_t, k_t, v_t, g_t, b_t = xs
        h = jnp.exp(g_t)[..., None, None] * h
        err = v_t - jnp.einsum("bhkv,bhk->bhv", h, k_t)
        h = h + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * err)
        return h, scale * jnp.einsum("bhkv,bhk->bhv", h, q_t)

    time_first = [jnp.moveaxis(t, 1, 0) for t in (q, k, v, g, beta)]
    final, o = jax.lax.scan(step, h0, time_first)
    return jnp.moveaxis(o, 0, 1), final


# ----------------------------------------------------------- the layer

def _forward(dims, xs, ws, biases, a, b, a_log, dt_bias, conv_states, h0):
    """Everything the backward needs, in the compute dtype."""
    heads, v_heads, dk, dv, scale = dims
    bsz, tokens = a.shape[:2]
    xps = [history_then_inputs(s, x) for s, x in zip(conv_states, xs)]
    pres = [conv_forward(xp, w, bias, tokens) for xp, w, bias in zip(xps, ws, biases)]
    ys = [pre * jax.nn.sigmoid(pre) for pre in pres]
    q_raw = ys[0].reshape(bsz, tokens, heads, dk)
    k_raw = ys[1].reshape(bsz, tokens, heads, dk)
    v = ys[2].reshape(bsz, tokens, v_heads, dv)
    q, k = l2norm(q_raw, QK_NORM_EPS), l2norm(k_raw, QK_NORM_EPS)
    g, beta = gates(a, b, a_log, dt_bias)
    o, final = delta_rule_scan(q, k, v, g, beta, h0, scale)
    return o, final, (xps, pres, q_raw, k_raw, q, k, v, g, beta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(dims, xs, ws, biases, a, b, a_log, dt_bias, conv_states, h0):
    return _layer_fwd(dims, xs, ws, biases, a, b, a_log, dt_bias, conv_states, h0)[0]


def _layer_fwd(dims, xs, ws, biases, a, b, a_log, dt_bias, conv_states, h0):
    o, final, saved = _forward(dims, xs, ws, biases, a, b, a_log, dt_bias, conv_states, h0)
    width = ws[0].shape[-1]
    new_states = tuple(jnp.swapaxes(xp[:, xp.shape[1] - (width - 1):], 1, 2)
                       for xp in saved[0])
    return (o, new_states, final), (ws, a, b, a_log, dt_bias, h0, saved)


def _layer_bwd(dims, res, cts):
    heads, v_heads, dk, dv, scale = dims
    ws, a, b, a_log, dt_bias, h0, (xps, pres, q_raw, k_raw, q, k, v, g, beta) = res
    do, dnew_states, dfinal = cts
    _, scan_vjp = jax.vjp(lambda *t: delta_rule_scan(*t, scale), q, k, v, g, beta, h0)
    dq, dk_, dv_, dg, dbeta, dh0 = scan_vjp((do, dfinal))
    da, db, da_log, ddt_bias = gates_backward(a, b, a_log, dt_bias, dg, dbeta)
    dq_raw = l2norm_backward(q_raw, dq, QK_NORM_BWD_EPS)
    dk_raw = l2norm_backward(k_raw, dk_, QK_NORM_BWD_EPS)
    dys = [t.reshape(t.shape[:2] + (-1,)) for t in (dq_raw, dk_raw, dv_)]
    dxs, dws, dbiases, dstates = [], [], [], []
    width = ws[0].shape[-1]
    for xp, w, pre, dy, dnew in zip(xps, ws, pres, dys, dnew_states):
        dxp, dw, dbias = conv_backward(xp, w, silu_backward(pre, dy))
        dxp = dxp.at[:, xp.shape[1] - (width - 1):].add(jnp.swapaxes(dnew, 1, 2))
        dstates.append(jnp.swapaxes(dxp[:, :width - 1], 1, 2))
        dxs.append(dxp[:, width - 1:])
        dws.append(dw)
        dbiases.append(dbias)
    return (tuple(dxs), tuple(dws), tuple(dbiases), da, db, da_log, ddt_bias, tuple(dstates),
            dh0)


_layer.defvjp(_layer_fwd, _layer_bwd)


def gated_deltanet(q_in, k_in, v_in, a, b, q_conv, k_conv, v_conv, q_bias, k_bias, v_bias,
                   A_log, dt_bias, *, num_heads, num_v_heads, head_dim, head_v_dim, scale=None,
                   initial_state=None, output_final_state=False):
    """The layer (module docstring): (o [B, T, Hv*Dv], final state or None)."""
    primals = (q_in, k_in, v_in, a, b, q_conv, k_conv, v_conv, q_bias, k_bias, v_bias,
               A_log, dt_bias)
    dt = _compute_dtype(*primals)
    bsz, tokens = a.shape[:2]
    width = q_conv.shape[-1]
    if initial_state is None:
        conv_states = tuple(jnp.zeros((bsz, x.shape[-1], width - 1), dt)
                            for x in (q_in, k_in, v_in))
        h0 = jnp.zeros((bsz, num_v_heads, head_dim, head_v_dim), dt)
    else:
        conv_states = tuple(s.astype(dt) for s in initial_state[0])
        h0 = initial_state[1].astype(dt)
    dims = (num_heads, num_v_heads, head_dim, head_v_dim,
            head_dim ** -0.5 if scale is None else scale)
    cast = [t.astype(dt) for t in primals]
    o, states, final = _layer(dims, tuple(cast[0:3]), tuple(cast[5:8]), tuple(cast[8:11]),
                              cast[3], cast[4], cast[11], cast[12], conv_states, h0)
    o = o.reshape(bsz, tokens, num_v_heads * head_v_dim).astype(q_in.dtype)
    if not output_final_state:
        return o, None
    return o, (tuple(s.astype(q_in.dtype) for s in states), final.astype(jnp.float32))

