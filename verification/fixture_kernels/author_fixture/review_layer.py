"""A GDN layer as a kernel author writes it elsewhere, of the kind the
review that started this project read: one `jax.custom_vjp` over the whole
layer (causal depthwise Conv1D + SiLU with a bias, QK L2 norm, the gates,
the chunked gated delta rule), a pure-JAX forward that caches each chunk's
triangular inverse and start state, a Pallas backward of the delta rule
(interpret mode) that walks the chunks in reverse with those caches, and a
decoupled Conv1D + SiLU backward in plain JAX. It imports neither
gdn_kernels nor verification: verification/tests/test_review_layer.py copies it
into a directory outside the repository and declares it there, as its
author would, and plants the review's two bugs back into the copy by
editing its text (the QK-norm backward's eps; the a_log / dt_bias
gradient's reduction).

Its own conventions and limits: arguments (x, b, a, conv_weight [K, 1, C],
conv_bias [C], a_log, dt_bias, heads and dims, chunk_size) positionally;
T a multiple of chunk_size (it reshapes T into chunks); a_log / dt_bias
[Hv], or [B, Hv] at a batch of one only (its forward broadcasts them as
[B, 1, Hv] against [B, T, Hv] gates after moving the batch axis, correct
only then); the QK norm always on, eps 1e-6; the incoming conv state
ignored (a training kernel: zeros before t = 0). Returns
(o [B, T, Hv, Dv], (conv_state [B, K-1, C], recurrent_state [B, Hv, Dk, Dv])).
Computes in float32; o in x's dtype, each gradient in its primal's dtype.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

F32 = jnp.float32
QK_NORM_EPS = 1e-6
QK_NORM_BWD_EPS = 1e-6


def _dot(a, b):
    return jnp.dot(a, b, preferred_element_type=F32, precision=jax.lax.Precision.HIGHEST)


def _dot_t(a, b):
    """a^T b."""
    return _dot(a.T, b)


# ----------------------------------------------------------- conv + SiLU

def conv_forward(x, w, bias):
    """x [B, T, C], w [K, 1, C], bias [C] -> pre-activation [B, T, C]
    (zeros before t = 0)."""
    width, tokens = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
    return bias + sum(w[j, 0] * padded[:, j:j + tokens] for j in range(width))


def conv_backward(x, w, dpre):
    """Cotangents of conv_forward: (dx [B, T, C], dw [K, 1, C], dbias [C])."""
    width, tokens = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
    dw = jnp.stack([jnp.sum(dpre * padded[:, j:j + tokens], axis=(0, 1))
                    for j in range(width)])[:, None]
    dpad = jnp.pad(dpre, ((0, 0), (0, width - 1), (0, 0)))
    dx = sum(w[j, 0] * dpad[:, width - 1 - j:width - 1 - j + tokens] for j in range(width))
    return dx, dw, jnp.sum(dpre, axis=(0, 1))


def conv_state_of(x, width):
    """The last K-1 inputs [B, K-1, C] (zeros before t = 0)."""
    return jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))[:, x.shape[1]:]


# ----------------------------------------------------------- QK L2 norm

def l2norm(x, eps):
    return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


def l2norm_backward(x, dy, eps):
    """d/dx of x * rsqrt(|x|^2 + eps): r (dy - y (y . dy)), y = x r."""
    r = jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)
    y = x * r
    return r * (dy - y * jnp.sum(y * dy, -1, keepdims=True))


# ----------------------------------------------------------- gates

def gate_params(p):
    """a_log / dt_bias [Hv] or [1, Hv] -> [1, 1, Hv] (one value per head)."""
    return p.reshape(1, 1, p.shape[-1])


def reduce_to_param(full, p):
    """Sum a [B, T, Hv] cotangent back to a parameter's shape ([Hv] or [1, Hv])."""
    return jnp.sum(full, axis=(0, 1)).reshape(p.shape)


# ----------------------------------------------------------- delta rule, one chunk

def _masks(c):
    i = jnp.arange(c)
    return (i[:, None] >= i[None, :]).astype(F32), (i[:, None] > i[None, :]).astype(F32)


def _between(c):
    """[C*C, C]: row (i, j) has ones at the tokens s with j < s <= i."""
    i, j, s = (jnp.arange(c).reshape(shape) for shape in ((c, 1, 1), (1, c, 1), (1, 1, c)))
    return ((j < s) & (s <= i)).astype(F32).reshape(c * c, c)


class Decays(NamedTuple):
    """One chunk's log decays, g [C] <= 0: cum[i] = G_i = g_0 + ... + g_i;
    pair[i, j] = G_i - G_j as the sum of the g between (a difference of two
    cumulative sums would cancel: ulp(|G|) in every exponent); tail[i] =
    G_last - G_i; incl / strict: exp(pair) for j <= i / j < i, else 0."""
    cum: jnp.ndarray
    pair: jnp.ndarray
    tail: jnp.ndarray
    incl: jnp.ndarray
    strict: jnp.ndarray


def decays(g):
    c = g.shape[0]
    lower, strict = _masks(c)
    pair = _dot(_between(c), g[:, None]).reshape(c, c)
    incl = jnp.where(lower > 0, jnp.exp(pair), 0.0)
    return Decays(_dot(lower, g[:, None])[:, 0], pair, pair[-1], incl, incl * strict)


def decays_backward(d_cum, d_pair, g):
    """dg from the cotangents of Decays.cum [C] and Decays.pair [C, C]
    (tail's folded into d_pair's last row)."""
    c = g.shape[0]
    lower, _ = _masks(c)
    return _dot_t(lower, d_cum[:, None])[:, 0] + _dot_t(_between(c), d_pair.reshape(c * c, 1))[:, 0]


def chunk_inverse(k, g, beta):
    """(I + A)^-1 of one chunk, A[i, j] = beta_i (k_i . k_j) exp(G_i - G_j), j < i;
    k [C, Dk], g, beta [C]."""
    c = k.shape[0]
    a = _dot(k * beta[:, None], k.T) * decays(g).strict
    eye = jnp.eye(c, dtype=F32)
    return jax.scipy.linalg.solve_triangular(eye + a, eye, lower=True, unit_diagonal=True)


def chunk_forward(q, k, v, g, beta, s0, tinv, scale):
    """One chunk from its start state s0 [Dk, Dv] with its cached inverse:
    (o [C, Dv], s_next [Dk, Dv])."""
    dec = decays(g)
    w = _dot(tinv, k * (beta * jnp.exp(dec.cum))[:, None])
    u = _dot(tinv, v * beta[:, None]) - _dot(w, s0)
    o = scale * (_dot(q * jnp.exp(dec.cum)[:, None], s0) + _dot(_dot(q, k.T) * dec.incl, u))
    s_next = jnp.exp(dec.cum[-1]) * s0 + _dot_t(k * jnp.exp(dec.tail)[:, None], u)
    return o, s_next


def chunk_backward(q, k, v, g, beta, s0, tinv, do, ds_next, scale):
    """Cotangents of chunk_forward (tinv's through A back to k, g, beta):
    (dq, dk, dv, dg, dbeta, ds0)."""
    dec = decays(g)
    ecum, etail, elast = jnp.exp(dec.cum), jnp.exp(dec.tail), jnp.exp(dec.cum[-1])
    kb, vb = k * beta[:, None], v * beta[:, None]
    ke = kb * ecum[:, None]
    w = _dot(tinv, ke)
    u = _dot(tinv, vb) - _dot(w, s0)
    qk = _dot(q, k.T)
    kd = k * etail[:, None]
    # o = scale (qe s0 + (qk * incl) u); s_next = e^last s0 + kd^T u
    du = scale * _dot_t(qk * dec.incl, do) + _dot(kd, ds_next)
    dp = scale * _dot(do, u.T) * dec.incl
    do_s0 = scale * _dot(do, s0.T)
    dq = _dot(dp, k) + do_s0 * ecum[:, None]
    dk = _dot_t(dp, q)
    d_pair = dp * qk
    d_cum = jnp.sum(do_s0 * q, 1) * ecum
    dkd = _dot(u, ds_next.T)
    dk += dkd * etail[:, None]
    d_pair = d_pair.at[-1].add(jnp.sum(dkd * kd, 1))
    d_cum = d_cum.at[-1].add(elast * jnp.sum(s0 * ds_next))
    ds0 = scale * _dot_t(q * ecum[:, None], do) + elast * ds_next - _dot_t(w, du)
    # u = tinv vb - w s0; w = tinv ke
    dw = -_dot(du, s0.T)
    dtinv = _dot(dw, ke.T) + _dot(du, vb.T)
    dke, dvb = _dot_t(tinv, dw), _dot_t(tinv, du)
    dkb = dke * ecum[:, None]
    d_cum += jnp.sum(dke * ke, 1)
    dv = dvb * beta[:, None]
    dbeta = jnp.sum(dvb * v, 1)
    # tinv = (I + A)^-1: dA = -tinv^T dtinv tinv^T on A's strictly lower part
    da = -_dot(_dot_t(tinv, dtinv), tinv.T) * (dec.strict > 0)
    d_pair += da * _dot(kb, k.T) * dec.strict
    dkb += _dot(da * dec.strict, k)
    dk += _dot_t(da * dec.strict, kb)
    dk += dkb * beta[:, None]
    dbeta += jnp.sum(dkb * k, 1)
    return dq, dk, dv, decays_backward(d_cum, d_pair, g), dbeta, ds0


# ----------------------------------------------------------- delta rule, whole rows

def delta_rule_forward(q, k, v, g, beta, s0, scale, chunk):
    """Head-first q, k [B, H, T, Dk], v [B, H, T, Dv], g, beta [B, H, T],
    s0 [B, H, Dk, Dv] -> (o, s_T, tinv [B, H, N, C, C], starts [B, H, N, Dk, Dv])."""
    b, h, t, dk = k.shape
    n = t // chunk

    def by_chunk(x):
        return jnp.moveaxis(x.reshape(b, h, n, chunk, *x.shape[3:]), 2, 0)

    qc, kc, vc, gc, bc = map(by_chunk, (q, k, v, g, beta))
    tinv = jax.vmap(jax.vmap(jax.vmap(chunk_inverse)))(kc, gc, bc)      # [N, B, H, C, C]
    fwd = jax.vmap(jax.vmap(functools.partial(chunk_forward, scale=scale)))

    def step(s, xs):
        o, s_next = fwd(*xs[:5], s, xs[5])
        return s_next, (o, s)

    s_t, (o, starts) = jax.lax.scan(step, s0, (qc, kc, vc, gc, bc, tinv))
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, t, -1)
    return o, s_t, jnp.moveaxis(tinv, 0, 2), jnp.moveaxis(starts, 0, 2)


def _backward_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, tinv_ref, starts_ref, do_ref,
                     dst_ref, dq_ref, dk_ref, dv_ref, dg_ref, dbeta_ref, ds0_ref, *,
                     chunk, chunks, scale):
    """One (batch, head): the chunks in reverse, carrying dS."""
    def body(i, ds):
        n = chunks - 1 - i
        rows = pl.ds(n * chunk, chunk)
        grads = chunk_backward(q_ref[rows, :], k_ref[rows, :], v_ref[rows, :], g_ref[0, rows],
                               beta_ref[0, rows], starts_ref[n], tinv_ref[n], do_ref[rows, :],
                               ds, scale)
        dq_ref[rows, :], dk_ref[rows, :], dv_ref[rows, :] = grads[:3]
        dg_ref[0, rows], dbeta_ref[0, rows] = grads[3], grads[4]
        return grads[5]

    ds0_ref[...] = jax.lax.fori_loop(0, chunks, body, dst_ref[...])


def delta_rule_backward(q, k, v, g, beta, tinv, starts, do, ds_t, scale, chunk):
    """The Pallas backward over a (B, H) grid, interpret mode: (dq, dk, dv, dg, dbeta, ds0)."""
    b, h, t, dk = k.shape
    dv_dim, n = v.shape[-1], t // chunk

    def rows(d):
        return pl.BlockSpec((None, None, t, d), lambda i, j: (i, j, 0, 0))

    def gate_rows():
        return pl.BlockSpec((None, None, 1, t), lambda i, j: (i, j, 0, 0))

    def per_chunk(*shape):
        return pl.BlockSpec((None, None, n, *shape), lambda i, j: (i, j, 0, 0, 0))

    state = pl.BlockSpec((None, None, dk, dv_dim), lambda i, j: (i, j, 0, 0))
    kernel = functools.partial(_backward_kernel, chunk=chunk, chunks=n, scale=scale)
    out_shape = [jax.ShapeDtypeStruct(x.shape, F32) for x in (q, k, v)]
    out_shape += [jax.ShapeDtypeStruct((b, h, 1, t), F32)] * 2
    out_shape += [jax.ShapeDtypeStruct((b, h, dk, dv_dim), F32)]
    dq, dk_, dv, dg, dbeta, ds0 = pl.pallas_call(
        kernel, grid=(b, h), out_shape=out_shape,
        in_specs=[rows(dk), rows(dk), rows(dv_dim), gate_rows(), gate_rows(),
                  per_chunk(chunk, chunk), per_chunk(dk, dv_dim), rows(dv_dim), state],
        out_specs=[rows(dk), rows(dk), rows(dv_dim), gate_rows(), gate_rows(), state],
        interpret=True,
    )(q, k, v, g[:, :, None], beta[:, :, None], tinv, starts, do, ds_t)
    return dq, dk_, dv, dg[:, :, 0], dbeta[:, :, 0], ds0


# ----------------------------------------------------------- the layer

def _split(y, hk, hv, dk, dv):
    b, t, _ = y.shape
    q, k, v = jnp.split(y, [hk * dk, 2 * hk * dk], axis=-1)
    return q.reshape(b, t, hk, dk), k.reshape(b, t, hk, dk), v.reshape(b, t, hv, dv)


def _head_first(x):
    return jnp.moveaxis(x, 2, 1)


def _layer_forward(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0, hk, hv, dk, dv, chunk):
    f = lambda z: z.astype(F32)
    xf, wf = f(x), f(conv_weight)
    pre = conv_forward(xf, wf, f(conv_bias))
    q_raw, k_raw, v = _split(jax.nn.silu(pre), hk, hv, dk, dv)
    q, k = l2norm(q_raw, QK_NORM_EPS), l2norm(k_raw, QK_NORM_EPS)
    soft_in = f(a) + gate_params(f(dt_bias))
    neg_a = -jnp.exp(gate_params(f(a_log)))
    g = neg_a * jax.nn.softplus(soft_in)
    beta = jax.nn.sigmoid(f(b))
    group = hv // hk
    qh, kh = (_head_first(jnp.repeat(z, group, axis=2)) for z in (q, k))
    o, s_t, tinv, starts = delta_rule_forward(qh, kh, _head_first(v), _head_first(g),
                                              _head_first(beta), s0, dk ** -0.5, chunk)
    out = (jnp.moveaxis(o, 1, 2).astype(x.dtype),
           (conv_state_of(x, conv_weight.shape[0]), s_t))
    res = (pre, q_raw, k_raw, qh, kh, v, g, beta, soft_in, neg_a, tinv, starts)
    return out, res


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12))
def _layer(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0, hk, hv, dk, dv, chunk):
    return _layer_forward(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0,
                          hk, hv, dk, dv, chunk)[0]


def _layer_fwd(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0, hk, hv, dk, dv, chunk):
    out, res = _layer_forward(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0,
                              hk, hv, dk, dv, chunk)
    return out, (x, b, a, conv_weight, conv_bias, a_log, dt_bias, res)


def _layer_bwd(hk, hv, dk, dv, chunk, saved, cts):
    x, b, a, conv_weight, conv_bias, a_log, dt_bias, res = saved
    pre, q_raw, k_raw, qh, kh, v, g, beta, soft_in, neg_a, tinv, starts = res
    do, (dconv_state, ds_t) = cts
    bsz, tokens = x.shape[:2]
    dqh, dkh, dvh, dgh, dbh, ds0 = delta_rule_backward(
        qh, kh, _head_first(v), _head_first(g), _head_first(beta), tinv, starts,
        _head_first(do.astype(F32)), ds_t.astype(F32), dk ** -0.5, chunk)
    group = hv // hk

    def to_key_heads(z):
        z = jnp.moveaxis(z, 1, 2)
        return z.reshape(bsz, tokens, hk, group, dk).sum(3)

    dq = l2norm_backward(q_raw, to_key_heads(dqh), QK_NORM_BWD_EPS)
    dk_ = l2norm_backward(k_raw, to_key_heads(dkh), QK_NORM_BWD_EPS)
    dy = jnp.concatenate([dq.reshape(bsz, tokens, -1), dk_.reshape(bsz, tokens, -1),
                          jnp.moveaxis(dvh, 1, 2).reshape(bsz, tokens, -1)], axis=-1)
    dpre = dy * jax.grad(lambda z: jnp.sum(jax.nn.silu(z)))(pre)
    dx, dw, dbias = conv_backward(x.astype(F32), conv_weight.astype(F32), dpre)
    width = conv_weight.shape[0]
    dx = dx.at[:, max(tokens - (width - 1), 0):].add(
        dconv_state.astype(F32)[:, max(width - 1 - tokens, 0):])
    dg, dbeta = jnp.moveaxis(dgh, 1, 2), jnp.moveaxis(dbh, 1, 2)
    dsoft = dg * neg_a * jax.nn.sigmoid(soft_in)
    da_log = reduce_to_param(dg * g, a_log)
    ddt_bias = reduce_to_param(dsoft, dt_bias)
    db = dbeta * beta * (1 - beta)
    grads = (dx, db, dsoft, dw, dbias, da_log, ddt_bias)
    primals = (x, b, a, conv_weight, conv_bias, a_log, dt_bias)
    return tuple(d.astype(p.dtype) for d, p in zip(grads, primals)) + (ds0,)


_layer.defvjp(_layer_fwd, _layer_bwd)


def gdn_layer(x, b, a, conv_weight, conv_bias, a_log, dt_bias, num_k_heads, num_v_heads,
              head_k_dim, head_v_dim, chunk_size=64, state=None):
    """The layer. x [B, T, C] (channels [q | k | v]); b, a [B, T, Hv];
    conv_weight [K, 1, C]; conv_bias [C]; a_log, dt_bias [Hv] or [1, Hv];
    state (conv_state, recurrent_state) or None: the conv state is ignored,
    the recurrent state [B, Hv, Dk, Dv] starts the recurrence.
    Returns (o [B, T, Hv, Dv], (conv_state, recurrent_state))."""
    bsz, tokens = x.shape[:2]
    if tokens % chunk_size:
        raise ValueError(f"x: T={tokens} must be a multiple of chunk_size={chunk_size}")
    for name, p in (("a_log", a_log), ("dt_bias", dt_bias)):
        if p.size != num_v_heads:
            raise ValueError(f"{name}: shape {p.shape}, expected [Hv] or [1, Hv]")
    s0 = (jnp.zeros((bsz, num_v_heads, head_k_dim, head_v_dim), F32) if state is None
          else state[1].astype(F32))
    return _layer(x, b, a, conv_weight, conv_bias, a_log, dt_bias, s0, num_k_heads,
                  num_v_heads, head_k_dim, head_v_dim, chunk_size)
