"""The chunked gated delta rule in plain JAX (XLA): forward and hand-written
backward, built from the per-chunk functions of `chunk_math`.

State-independent work (decay, triangular inverse, WY factors, intra-chunk
attention) is vmapped over all chunks at once; only the [Dk, Dv] state (and,
backwards, its cotangent) is carried by a scan over chunks.
Residuals saved by the forward: the inverse of every chunk and the state
entering every chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import chunk_math as cm
from . import layout
from .manual_axes import varying_like


class Residuals(NamedTuple):
    """tinv [N, B, Hv, C, C], states [N, B, Hv, Dk, Dv] (state entering each
    chunk), both in the accumulation dtype."""
    tinv: jnp.ndarray
    states: jnp.ndarray


def _vmap_n(fn, depth: int, in_axes=0):
    for _ in range(depth):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


def _chunked_inputs(q, k, v, g, beta, chunk, acc):
    """Contract layout -> chunked layout, key heads repeated to value heads."""
    group = v.shape[2] // q.shape[2]
    qc = layout.to_chunks(layout.repeat_heads(q, group), chunk, acc)
    kc = layout.to_chunks(layout.repeat_heads(k, group), chunk, acc)
    vc = layout.to_chunks(v, chunk, acc)
    gc = layout.scalars_to_chunks(g, chunk, acc)
    bc = layout.scalars_to_chunks(beta, chunk, acc)
    return qc, kc, vc, gc, bc


def _chunked_segments(seg, heads, chunk, acc):
    """chunk_math.ChunkSegments [N, B, Hv, C, 1] of packed documents, or None."""
    if seg is None:
        return None
    doc, start = layout.segment_scalars(seg, heads, chunk, acc)
    return cm.ChunkSegments(doc=layout.scalars_to_chunks(doc, chunk, acc),
                            start=layout.scalars_to_chunks(start, chunk, acc))


# The stages below are separate functions so that benchmarks/profile_vjp.py
# can jit and time each alone; forward and backward are their compositions.

def forward_intra(q, k, v, g, beta, chunk, acc, seg=None):
    """Chunked q, k and the state-independent ChunkIntra of every chunk
    (seg: segments.Segments of packed documents, or None)."""
    qc, kc, vc, gc, bc = _chunked_inputs(q, k, v, g, beta, chunk, acc)
    segc = _chunked_segments(seg, v.shape[2], chunk, acc)
    return qc, kc, _vmap_n(cm.chunk_intra, 3)(kc, vc, gc, bc, segc)


def state_scan(s0, kc, intra, acc):
    """The scan over chunks carrying the state. Returns (final state, state
    entering every chunk, new values E of every chunk)."""
    def step(s, xs):
        k_n, intra_n = xs
        new_values, s1 = _vmap_n(cm.chunk_state_step, 2)(s, k_n, intra_n)
        return s1, (s, new_values)

    s0 = varying_like(s0.astype(acc), kc, intra)   # under shard_map: varies like the chunks
    s_final, (states, new_values) = lax.scan(step, s0, (kc, intra))
    return s_final, states, new_values


def chunk_outputs(qc, kc, states, new_values, dec, scale, t):
    """o [B, T, Hv, Dv] of every chunk, from its entering state and E."""
    oc = _vmap_n(cm.chunk_output, 3, in_axes=(0, 0, 0, 0, 0, None))(
        qc, kc, states, new_values, dec, scale)
    return layout.from_chunks(oc, t)


def forward(q, k, v, g, beta, s0, scale, chunk, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; seg: segments.Segments or None (padding already
    zeroed by the caller). Returns (o [B, T, Hv, Dv] accumulation dtype,
    final state [B, Hv, Dk, Dv], Residuals)."""
    acc = cm.accumulation_dtype(v.dtype)
    qc, kc, intra = forward_intra(q, k, v, g, beta, chunk, acc, seg)
    s_final, states, new_values = state_scan(s0, kc, intra, acc)
    o = chunk_outputs(qc, kc, states, new_values, intra.dec, scale, q.shape[1])
    return o, s_final, Residuals(intra.tinv, states)


def backward_intra(q, k, v, g, beta, tinv, do, scale, chunk, acc, seg=None):
    """Chunked inputs and the ChunkBackwardIntra of every chunk (decay, WY
    factors from the cached inverse, attention, dS1-independent terms)."""
    qc, kc, vc, gc, bc = _chunked_inputs(q, k, v, g, beta, chunk, acc)
    doc = layout.to_chunks(do, chunk, acc)
    segc = _chunked_segments(seg, v.shape[2], chunk, acc)
    bwd = _vmap_n(cm.chunk_backward_intra, 3, in_axes=(0,) * 7 + (None, 0))(
        qc, kc, vc, gc, bc, tinv, doc, scale, segc)
    return qc, kc, vc, bc, doc, bwd


def state_cotangent_scan(ds_final, kc, bwd, acc):
    """The reverse scan carrying dS. Returns (dS entering the first chunk,
    dS1 at the end of every chunk, dE of every chunk)."""
    def step(ds1, xs):
        k_n, intra_n, terms_n = xs
        d_new, ds0 = _vmap_n(cm.chunk_state_cotangent_step, 2)(ds1, k_n, intra_n, terms_n)
        return ds0, (ds1, d_new)

    ds_final = varying_like(ds_final.astype(acc), kc, bwd)
    ds_initial, (ds_ends, d_new) = lax.scan(step, ds_final, (kc, bwd.intra, bwd.terms),
                                            reverse=True)
    return ds_initial, ds_ends, d_new


def chunk_grads(qc, kc, vc, bc, states, doc, ds_ends, d_new, bwd, scale):
    """ChunkGrads of every chunk (chunked layout)."""
    return _vmap_n(cm.chunk_backward, 3, in_axes=(0,) * 9 + (None,))(
        qc, kc, vc, bc, states, doc, ds_ends, d_new, bwd, scale)


def grads_to_contract(grads, t, group):
    """(dq, dk, dv, dg, dbeta) in the contract layout; dq, dk summed over
    each key head's value heads."""
    dq = layout.sum_head_groups(layout.from_chunks(grads.dq, t), group)
    dk = layout.sum_head_groups(layout.from_chunks(grads.dk, t), group)
    dv = layout.from_chunks(grads.dv, t)
    dg = layout.scalars_from_chunks(grads.dg, t)
    dbeta = layout.scalars_from_chunks(grads.dbeta, t)
    return dq, dk, dv, dg, dbeta


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, chunk, seg=None):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. do [B, T, Hv, Dv], ds_final [B, Hv, Dk, Dv]; seg as in
    `forward` (padding cotangents are zeroed by the caller)."""
    acc = cm.accumulation_dtype(v.dtype)
    qc, kc, vc, bc, doc, bwd = backward_intra(q, k, v, g, beta, res.tinv, do, scale,
                                              chunk, acc, seg)
    ds_initial, ds_ends, d_new = state_cotangent_scan(ds_final, kc, bwd, acc)
    grads = chunk_grads(qc, kc, vc, bc, res.states, doc, ds_ends, d_new, bwd, scale)
    dq, dk, dv, dg, dbeta = grads_to_contract(grads, q.shape[1], v.shape[2] // q.shape[2])
    return dq, dk, dv, dg, dbeta, ds_initial
