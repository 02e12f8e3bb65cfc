"""The chunked gated delta rule in plain JAX (XLA): forward and hand-written
backward, built from the per-chunk functions of `chunk_math`.

Chunks are grouped into super-blocks of S = SUPER_BLOCK chunks (fewer when
the row has fewer chunks). The forward is one scan over the super-blocks:
each step computes the state-independent work of its S chunks (decay,
triangular inverse, WY factors) vmapped over chunks, batch rows and heads,
carries the [Dk, Dv] state across them by an inner scan, and writes their
outputs. The backward is the same walk in reverse. A step's intermediates
are [S, B, H, C, C]-sized, so they stay in cache whatever T is (vmapping
over all chunks at once made them grow with T and leave the cache: time per
token rose with T).

Residuals saved by the forward: the inputs in the blocked layout and, per
chunk, the inverse, the WY factors u and w, the attention P, the state
entering it and the values E it wrote. The backward recomputes only the
decay factors (elementwise); everything with a matmul behind it is read.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax

from . import chunk_math as cm
from . import layout
from .manual_axes import varying_like

# Chunks per step of the scans over chunks.
SUPER_BLOCK = 8


class ChunkResiduals(NamedTuple):
    """What the forward keeps of every chunk, [NB, S, B, Hv, ...] in the
    accumulation dtype: tinv, p [C, C] (inverse, attention); u, new_values
    [C, Dv] and w [C, Dk] (WY factors, the values E written); states
    [Dk, Dv] (the state entering the chunk)."""
    tinv: jax.Array
    p: jax.Array
    u: jax.Array
    w: jax.Array
    new_values: jax.Array
    states: jax.Array


class Residuals(NamedTuple):
    """blocks: the inputs in the blocked layout (Blocks); chunks:
    ChunkResiduals."""
    blocks: "Blocks"
    chunks: ChunkResiduals


class Blocks(NamedTuple):
    """Inputs in the blocked layout [NB, S, B, Hv, C, *] (q, k repeated to
    the value heads), seg: chunk_math.ChunkSegments of the same layout or
    None."""
    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    seg: cm.ChunkSegments | None


def _vmap_n(fn, depth: int, in_axes=0):
    for _ in range(depth):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


def to_blocks(q, k, v, g, beta, seg, chunk, acc) -> Blocks:
    """Contract layout -> blocked layout, key heads repeated to value heads;
    seg: segments.Segments of packed documents, or None."""
    group = v.shape[2] // q.shape[2]
    _, per_block = layout.blocks_of(q.shape[1], chunk, SUPER_BLOCK)

    def tokens(x):
        return layout.to_blocks(x, chunk, per_block, acc)

    def scalars(x):
        return layout.scalars_to_blocks(x, chunk, per_block, acc)

    segb = None
    if seg is not None:
        doc, start = layout.segment_scalars(seg, v.shape[2], chunk * per_block, acc)
        segb = cm.ChunkSegments(doc=scalars(doc), start=scalars(start))
    return Blocks(tokens(layout.repeat_heads(q, group)), tokens(layout.repeat_heads(k, group)),
                  tokens(v), scalars(g), scalars(beta), segb)


def _slim(intra: cm.ChunkIntra) -> cm.ChunkIntra:
    """Only what chunk_state_step reads (u, w, the tail and total decays),
    so the inner scan slices nothing it does not use."""
    dec = cm.ChunkDecay(gam=None, decay=None, gam_exp=None, tail=intra.dec.tail,
                        total=intra.dec.total)
    return cm.ChunkIntra(dec=dec, tinv=None, u=intra.u, w=intra.w)


# --------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------

def state_pass(s, k, intra):
    """The state across one block's S chunks (inner scan). s [B, Hv, Dk, Dv];
    k [S, B, Hv, C, Dk]. Returns (state after the block, state entering each
    chunk [S, ...], new values E of each chunk [S, B, Hv, C, Dv])."""
    def step(s, xs):
        k_n, intra_n = xs
        new_values, s1 = _vmap_n(cm.chunk_state_step, 2)(s, k_n, intra_n)
        return s1, (s, new_values)

    s_end, (states, new_values) = lax.scan(step, s, (k, _slim(intra)))
    return s_end, states, new_values


def block_forward(s, blk: Blocks, scale):
    """One step of the forward scan: (state after the block, (o,
    ChunkResiduals) of its S chunks)."""
    intra = _vmap_n(cm.chunk_intra, 3)(blk.k, blk.v, blk.g, blk.beta, blk.seg)
    s_end, states, new_values = state_pass(s, blk.k, intra)
    p = _vmap_n(cm.chunk_attention, 3)(blk.q, blk.k, intra.dec)
    o = _vmap_n(cm.chunk_output, 3, in_axes=(0, 0, 0, 0, 0, None))(
        blk.q, states, new_values, p, intra.dec, scale)
    return s_end, (o, ChunkResiduals(intra.tinv, p, intra.u, intra.w, new_values, states))


def forward(q, k, v, g, beta, s0, scale, chunk, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; seg: segments.Segments or None (padding already
    zeroed by the caller). Returns (o [B, T, Hv, Dv] accumulation dtype,
    final state [B, Hv, Dk, Dv], Residuals)."""
    acc = cm.accumulation_dtype(v.dtype)
    blocks = to_blocks(q, k, v, g, beta, seg, chunk, acc)
    s0 = varying_like(s0.astype(acc), blocks)   # under shard_map: varies like the chunks
    s_final, (o, chunks) = lax.scan(lambda s, blk: block_forward(s, blk, scale), s0, blocks)
    return layout.from_blocks(o, q.shape[1]), s_final, Residuals(blocks, chunks)


# --------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------

def cotangent_pass(ds1, k, bwd: cm.ChunkBackwardIntra):
    """dS back across one block's S chunks (inner reverse scan). Returns (dS
    entering the block, dS1 at the end of each chunk, dE of each chunk)."""
    def step(ds1, xs):
        k_n, intra_n, terms_n = xs
        d_new, ds0 = _vmap_n(cm.chunk_state_cotangent_step, 2)(ds1, k_n, intra_n, terms_n)
        return ds0, (ds1, d_new)

    ds_start, (ds_ends, d_new) = lax.scan(step, ds1, (k, _slim(bwd.intra), bwd.terms),
                                          reverse=True)
    return ds_start, ds_ends, d_new


def _backward_terms(q, g, seg, res: ChunkResiduals, do, scale) -> cm.ChunkBackwardIntra:
    """One chunk's ChunkBackwardIntra from its residuals (only the decay
    factors are recomputed)."""
    intra = cm.ChunkIntra(dec=cm.chunk_decay(g, seg), tinv=res.tinv, u=res.u, w=res.w)
    return cm.chunk_backward_terms(q, intra, res.p, do, scale)


def block_backward(ds1, xs, scale):
    """One step of the backward scan over (Blocks, ChunkResiduals, do
    [S, B, Hv, C, Dv]): (dS entering the block, ChunkGrads of its S chunks)."""
    blk, res, do = xs
    bwd = _vmap_n(_backward_terms, 3, in_axes=(0,) * 5 + (None,))(
        blk.q, blk.g, blk.seg, res, do, scale)
    ds0, ds_ends, d_new = cotangent_pass(ds1, blk.k, bwd)
    grads = _vmap_n(cm.chunk_backward, 3, in_axes=(0,) * 10 + (None,))(
        blk.q, blk.k, blk.v, blk.beta, res.states, res.new_values, do, ds_ends, d_new, bwd,
        scale)
    return ds0, grads


def grads_to_contract(grads, t, group):
    """(dq, dk, dv, dg, dbeta) in the contract layout; dq, dk summed over
    each key head's value heads."""
    dq = layout.sum_head_groups(layout.from_blocks(grads.dq, t), group)
    dk = layout.sum_head_groups(layout.from_blocks(grads.dk, t), group)
    dv = layout.from_blocks(grads.dv, t)
    dg = layout.scalars_from_blocks(grads.dg, t)
    dbeta = layout.scalars_from_blocks(grads.dbeta, t)
    return dq, dk, dv, dg, dbeta


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, chunk, seg=None):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. do [B, T, Hv, Dv], ds_final [B, Hv, Dk, Dv]; seg as in
    `forward` (padding cotangents are zeroed by the caller). The inputs are
    read from the residuals' blocks; q, k, v, g, beta give the shapes."""
    acc = cm.accumulation_dtype(v.dtype)
    _, per_block = layout.blocks_of(q.shape[1], chunk, SUPER_BLOCK)
    do = layout.to_blocks(do, chunk, per_block, acc)
    ds_final = varying_like(ds_final.astype(acc), res, do)
    ds_initial, grads = lax.scan(lambda ds, xs: block_backward(ds, xs, scale), ds_final,
                                 (res.blocks, res.chunks, do), reverse=True)
    dq, dk, dv, dg, dbeta = grads_to_contract(grads, q.shape[1], v.shape[2] // q.shape[2])
    return dq, dk, dv, dg, dbeta, ds_initial
