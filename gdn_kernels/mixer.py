"""gdn_decoupled_conv1d: Conv1D+SiLU, split, QK L2 norm, gates and the
chunked gated delta rule under ONE jax.custom_vjp.

Backward order: delta-rule backward (backend kernel), L2-norm VJP with the
same eps, gate VJP with the shape-preserving a_log/dt_bias reduction, beta
VJP, then the decoupled Conv1D+SiLU backward (plain JAX shift-multiply).
The forward keeps the extended conv input and the prologue's outputs as
residuals (the same compiled temp memory as recomputing them at
B2-T4096-D128, and fresh buffers cost page faults on a CPU); only the
pre-activation is recomputed, block by block inside the conv backward."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import conv1d, gates, l2norm, segments
from .backends import STATE_BYTES_PER_STEP, backend_for, kernel_settings
from .chunk_math import accumulation_dtype
from .manual_axes import align_varying
from .segments import zero_padding_all
from .state import GDNState, zero_state


@dataclasses.dataclass(frozen=True)
class MixerConfig:
    """Static configuration of one gdn_decoupled_conv1d call. `eps` is the
    single QK L2-norm epsilon read by both the forward and the backward."""
    impl: str
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    use_qk_norm: bool
    eps: float
    scale: float
    chunk_size: int
    interpret: str = "n/a"  # resolved GDN_INTERPRET mode (pallas): part of the jit cache key
    state_bytes_per_step: int = STATE_BYTES_PER_STEP   # pallas grid step budget


class Prologue(NamedTuple):
    """Everything between x and the delta rule, in the accumulation dtype.
    pre [B, T, C]; q_raw, k_raw, q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv];
    g, beta [B, T, Hv]."""
    pre: jnp.ndarray
    q_raw: jnp.ndarray
    k_raw: jnp.ndarray
    q: jnp.ndarray
    k: jnp.ndarray
    v: jnp.ndarray
    g: jnp.ndarray
    beta: jnp.ndarray


def split_heads(y, cfg: MixerConfig):
    """[B, T, C] -> q, k [B, T, Hk, Dk], v [B, T, Hv, Dv]."""
    bsz, t, _ = y.shape
    nq = cfg.num_k_heads * cfg.head_k_dim
    q = y[..., :nq].reshape(bsz, t, cfg.num_k_heads, cfg.head_k_dim)
    k = y[..., nq:2 * nq].reshape(bsz, t, cfg.num_k_heads, cfg.head_k_dim)
    v = y[..., 2 * nq:].reshape(bsz, t, cfg.num_v_heads, cfg.head_v_dim)
    return q, k, v


def merge_heads(dq, dk, dv):
    """Inverse of split_heads for cotangents -> [B, T, C]."""
    bsz, t = dq.shape[:2]
    return jnp.concatenate([dq.reshape(bsz, t, -1), dk.reshape(bsz, t, -1),
                            dv.reshape(bsz, t, -1)], axis=-1)


def _conv_windows(seg, conv_weight):
    """segments.ConvWindows of packed documents, or None."""
    return None if seg is None else segments.conv_windows(seg, conv_weight.shape[0])


def _extended_input(x, hist, seg, win):
    """The conv's input row behind its history: [B, K-1+T, C], hist [B, K-1, C]
    then x (packed: x's tokens in compact order, padding slots 0 at the end)."""
    row = x if seg is None else segments.to_compact(x, win, seg.pad)
    return jnp.concatenate([hist, row], axis=1)


def _valid(win):
    return None if win is None else win.valid


def _conv_forward(ext, weight, seg, win):
    """(silu(pre), pre) [B, T, C] from the extended input; packed: each tap
    reads only its own document (padding rows are 0)."""
    pre = conv1d.conv1d_preactivation(ext, weight, _valid(win))
    if seg is not None:
        pre = segments.from_compact(pre, win, seg.pad)
    return jax.nn.silu(pre), pre


def _tail_index(win, history: int):
    """[B, K-1] extended positions of the row's next window (packed)."""
    return win.count[:, None] + jnp.arange(history, dtype=jnp.int32)


def conv_state(ext, history: int, seg, win):
    """The K-1 inputs the row's next token reads [B, K-1, C]: the last K-1
    slots of the extended input, 0 where they precede the last document."""
    if seg is None:
        return ext[:, ext.shape[1] - history:]
    kept = jnp.take_along_axis(ext, _tail_index(win, history)[..., None], axis=1)
    return jnp.where(win.tail_keep[..., None], kept, jnp.zeros((), ext.dtype))


def _add_conv_state_cotangent(dhist, drow, dconv, seg, win):
    """(dhist [B, K-1, C], drow [B, T, C]), the history and row parts of
    dext, plus the cotangent of conv_state's result."""
    history = dconv.shape[1]
    if seg is None and drow.shape[1] >= history:
        return dhist, drow.at[:, drow.shape[1] - history:].add(dconv)
    dext = jnp.concatenate([dhist, drow], axis=1)
    if seg is None:
        dext = dext.at[:, dext.shape[1] - history:].add(dconv)
    else:
        dconv = jnp.where(win.tail_keep[..., None], dconv, jnp.zeros((), dconv.dtype))
        dext = jax.vmap(lambda d, i, u: d.at[i].add(u))(dext, _tail_index(win, history), dconv)
    return dext[:, :history], dext[:, history:]


def _conv_backward(ext, weight, dy, dconv, seg, win):
    """(dx [B, T, C], dhist [B, K-1, C], dw [K, C]) of _conv_forward and
    conv_state, given dy [B, T, C] (of silu(pre)) and dconv [B, K-1, C]."""
    if seg is not None:
        dy = segments.to_compact(dy, win, seg.pad)
    dhist, drow, dw = conv1d.conv1d_silu_backward(ext, weight, dy, _valid(win))
    dhist, dx = _add_conv_state_cotangent(dhist, drow, dconv, seg, win)
    if seg is not None:
        dx = segments.from_compact(dx, win, seg.pad)
    return dx, dhist, dw


def prologue(cfg: MixerConfig, ext, conv_weight, a, b, a_log, dt_bias, seg=None,
             win=None) -> Prologue:
    """ext: the extended conv input (_extended_input) in the accumulation
    dtype; seg, win: segments.Segments and ConvWindows of packed documents, or
    None (q, k, v, g, beta come out exactly 0 at padding tokens)."""
    acc = ext.dtype
    y, pre = _conv_forward(ext, conv_weight.astype(acc), seg, win)
    q_raw, k_raw, v = split_heads(y, cfg)
    if cfg.use_qk_norm:
        q, k = l2norm.l2norm_forward(q_raw, cfg.eps), l2norm.l2norm_forward(k_raw, cfg.eps)
    else:
        q, k = q_raw, k_raw
    g = gates.gate_forward(a.astype(acc), a_log.astype(acc), dt_bias.astype(acc))
    beta = gates.beta_forward(b.astype(acc))
    g, beta = zero_padding_all(seg, g, beta)
    return Prologue(pre, q_raw, k_raw, q, k, v, g, beta)


def initial_state(cfg: MixerConfig, x, conv_weight, state):
    """GDNState in the accumulation dtype: `state`, or the zeros None
    stands for (state.zero_state)."""
    acc = accumulation_dtype(x.dtype)
    if state is None:
        state = zero_state(x, conv_weight.shape[0], cfg.num_v_heads, cfg.head_k_dim,
                           cfg.head_v_dim)
    return GDNState(state.conv.astype(acc), state.recurrent.astype(acc))


def _inputs(cfg, x, conv_weight, seg, state):
    """(ext, win, incoming GDNState) shared by the forward and the backward."""
    win = _conv_windows(seg, conv_weight)
    s_in = initial_state(cfg, x, conv_weight, state)
    ext = _extended_input(x.astype(s_in.conv.dtype), s_in.conv, seg, win)
    return ext, win, s_in


def prologue_of(cfg: MixerConfig, x, conv_weight, a, b, a_log, dt_bias, seg=None,
                state=None) -> Prologue:
    """The Prologue of one call from its public inputs (x [B, T, C], ...)."""
    ext, win, _ = _inputs(cfg, x, conv_weight, seg, state)
    return prologue(cfg, ext, conv_weight, a, b, a_log, dt_bias, seg, win)


def _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg, state):
    """((o, GDNState after the call), residuals): the extended conv input,
    its ConvWindows (None unless packed), the Prologue without pre (the conv
    backward recomputes it block by block) and the delta rule's residuals."""
    ext, win, s_in = _inputs(cfg, x, conv_weight, seg, state)
    pro = prologue(cfg, ext, conv_weight, a, b, a_log, dt_bias, seg, win)
    o, s_final, res = backend_for(cfg.impl, x.shape[1]).forward(
        pro.q, pro.k, pro.v, pro.g, pro.beta, s_in.recurrent, cfg.scale, kernel_settings(cfg),
        seg)
    (o,) = zero_padding_all(seg, o.astype(x.dtype))
    conv = conv_state(ext, conv_weight.shape[0] - 1, seg, win).astype(x.dtype)
    return (o, GDNState(conv, s_final)), (ext, win, pro._replace(pre=None), res)


def gdn_mixer(cfg: MixerConfig, x, conv_weight, a, b, a_log, dt_bias, seg=None, state=None):
    """(o [B, T, Hv, Dv] in x's dtype, GDNState after the call). seg:
    segments.Segments of packed documents, or None; state: the incoming
    GDNState, or None (zeros). Under jax.shard_map the inputs first share one
    varying type (manual_axes)."""
    *arrays, state = align_varying(x, conv_weight, a, b, a_log, dt_bias, state)
    return _mixer_vjp(cfg, *arrays, seg, state)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mixer_vjp(cfg: MixerConfig, x, conv_weight, a, b, a_log, dt_bias, seg=None, state=None):
    return _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg, state)[0]


def _fwd(cfg, x, conv_weight, a, b, a_log, dt_bias, seg=None, state=None):
    out, res = _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg, state)
    return out, (x, conv_weight, a, b, a_log, dt_bias, seg, state, res)


def _bwd(cfg, saved, cotangents):
    x, conv_weight, a, b, a_log, dt_bias, seg, state, (ext, win, pro, res) = saved
    do, d_state = cotangents
    acc = accumulation_dtype(x.dtype)
    (do,) = zero_padding_all(seg, do.astype(acc))
    dq, dk, dv, dg, dbeta, ds0 = backend_for(cfg.impl, x.shape[1]).backward(
        pro.q, pro.k, pro.v, pro.g, pro.beta, res, do,
        d_state.recurrent.astype(acc), cfg.scale, kernel_settings(cfg), seg)
    dq, dk, dv, dg, dbeta = zero_padding_all(seg, dq, dk, dv, dg, dbeta)
    if cfg.use_qk_norm:
        dq = l2norm.l2norm_backward(pro.q_raw, dq, cfg.eps)
        dk = l2norm.l2norm_backward(pro.k_raw, dk, cfg.eps)
    dx, dhist, dw = _conv_backward(ext, conv_weight.astype(acc), merge_heads(dq, dk, dv),
                                   d_state.conv.astype(acc), seg, win)
    da, da_log, ddt_bias = gates.gate_backward(a.astype(acc), a_log.astype(acc),
                                               dt_bias.astype(acc), dg,
                                               None if seg is None else seg.pad)
    (db,) = zero_padding_all(seg, gates.beta_backward(b.astype(acc), dbeta))
    grads = (dx, dw, da, db, da_log, ddt_bias)
    primals = (x, conv_weight, a, b, a_log, dt_bias)
    grads = tuple(d.astype(p.dtype) for d, p in zip(grads, primals))
    d_in = None if state is None else GDNState(dhist.astype(state.conv.dtype),
                                               ds0.astype(state.recurrent.dtype))
    return grads + (None, d_in)


_mixer_vjp.defvjp(_fwd, _bwd)
