"""gdn_decoupled_conv1d: Conv1D+SiLU, split, QK L2 norm, gates and the
chunked gated delta rule under ONE jax.custom_vjp.

Backward order: delta-rule backward (backend kernel), L2-norm VJP with the
same eps, gate VJP with the shape-preserving a_log/dt_bias reduction, beta
VJP, then the decoupled Conv1D+SiLU backward (plain JAX shift-multiply)."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import conv1d, gates, l2norm, segments
from .backends import get_backend
from .chunk_math import accumulation_dtype
from .segments import zero_padding_all


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


def _conv_forward(x, weight, seg, win):
    """(silu(pre), pre) [B, T, C]; packed: the conv runs over the row with its
    padding deleted and is cut at document starts (padding rows are 0)."""
    if seg is None:
        return conv1d.conv1d_silu_forward(x, weight)
    pre_c = conv1d.conv1d_preactivation(segments.to_compact(x, win, seg.pad), weight,
                                        win.valid)
    pre = segments.from_compact(pre_c, win, seg.pad)
    return jax.nn.silu(pre), pre


def _conv_backward(x, weight, pre, dy, seg, win):
    """(dx [B, T, C], dw [K, C]) of _conv_forward given dy [B, T, C]."""
    if seg is None:
        return conv1d.conv1d_silu_backward(x, weight, pre, dy)
    dpre = dy * conv1d.silu_grad(pre)
    dx_c, dw = conv1d.conv1d_backward(segments.to_compact(x, win, seg.pad), weight,
                                      segments.to_compact(dpre, win, seg.pad), win.valid)
    return segments.from_compact(dx_c, win, seg.pad), dw


def prologue(cfg: MixerConfig, x, conv_weight, a, b, a_log, dt_bias, seg=None,
             win=None) -> Prologue:
    """seg, win: segments.Segments and ConvWindows of packed documents, or
    None (q, k, v, g, beta come out exactly 0 at padding tokens)."""
    acc = accumulation_dtype(x.dtype)
    y, pre = _conv_forward(x.astype(acc), conv_weight.astype(acc), seg, win)
    q_raw, k_raw, v = split_heads(y, cfg)
    if cfg.use_qk_norm:
        q, k = l2norm.l2norm_forward(q_raw, cfg.eps), l2norm.l2norm_forward(k_raw, cfg.eps)
    else:
        q, k = q_raw, k_raw
    g = gates.gate_forward(a.astype(acc), a_log.astype(acc), dt_bias.astype(acc))
    beta = gates.beta_forward(b.astype(acc))
    g, beta = zero_padding_all(seg, g, beta)
    return Prologue(pre, q_raw, k_raw, q, k, v, g, beta)


def _zero_state(pro: Prologue):
    bsz, hv, dk, dv = pro.v.shape[0], pro.v.shape[2], pro.q.shape[3], pro.v.shape[3]
    return jnp.zeros((bsz, hv, dk, dv), pro.v.dtype)


def _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg):
    win = _conv_windows(seg, conv_weight)
    pro = prologue(cfg, x, conv_weight, a, b, a_log, dt_bias, seg, win)
    o, _, res = get_backend(cfg.impl).forward(pro.q, pro.k, pro.v, pro.g, pro.beta,
                                              _zero_state(pro), cfg.scale, cfg.chunk_size,
                                              seg)
    (o,) = zero_padding_all(seg, o.astype(x.dtype))
    return o, res


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def gdn_mixer(cfg: MixerConfig, x, conv_weight, a, b, a_log, dt_bias, seg=None):
    """o [B, T, Hv, Dv] in x's dtype. seg: segments.Segments of packed
    documents, or None."""
    return _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg)[0]


def _fwd(cfg, x, conv_weight, a, b, a_log, dt_bias, seg=None):
    o, res = _forward(cfg, x, conv_weight, a, b, a_log, dt_bias, seg)
    return o, (x, conv_weight, a, b, a_log, dt_bias, seg, res)


def _bwd(cfg, saved, do):
    x, conv_weight, a, b, a_log, dt_bias, seg, res = saved
    acc = accumulation_dtype(x.dtype)
    win = _conv_windows(seg, conv_weight)
    pro = prologue(cfg, x, conv_weight, a, b, a_log, dt_bias, seg, win)
    (do,) = zero_padding_all(seg, do.astype(acc))
    dq, dk, dv, dg, dbeta, _ = get_backend(cfg.impl).backward(
        pro.q, pro.k, pro.v, pro.g, pro.beta, res, do,
        _zero_state(pro), cfg.scale, cfg.chunk_size, seg)
    dq, dk, dv, dg, dbeta = zero_padding_all(seg, dq, dk, dv, dg, dbeta)
    if cfg.use_qk_norm:
        dq = l2norm.l2norm_backward(pro.q_raw, dq, cfg.eps)
        dk = l2norm.l2norm_backward(pro.k_raw, dk, cfg.eps)
    dx, dw = _conv_backward(x.astype(acc), conv_weight.astype(acc), pro.pre,
                            merge_heads(dq, dk, dv), seg, win)
    da, da_log, ddt_bias = gates.gate_backward(a.astype(acc), a_log.astype(acc),
                                               dt_bias.astype(acc), dg,
                                               None if seg is None else seg.pad)
    (db,) = zero_padding_all(seg, gates.beta_backward(b.astype(acc), dbeta))
    grads = (dx, dw, da, db, da_log, ddt_bias)
    primals = (x, conv_weight, a, b, a_log, dt_bias)
    return tuple(d.astype(p.dtype) for d, p in zip(grads, primals)) + (None,)


gdn_mixer.defvjp(_fwd, _bwd)
