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

The inputs stay in the contract layout [B, T, H, D]: each scan step slices
its super-block and transposes it to the chunk layout [S, B, H, C, D], and
writes its outputs (gradients) back into a [B, T, H, D] carry buffer in
place, so the layout change is one small in-cache copy per block, not a
pass over every input and output in memory (a large fresh buffer also
costs page faults on a CPU).

Residuals saved by the forward, per chunk: the inverse, the WY factors u
and w, the attention P, the state entering it and the values E it wrote.
The backward reads the inputs again (custom_vjp keeps them) and recomputes
only the decay factors (elementwise); everything with a matmul behind it is
read.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import chunk_math as cm
from . import layout, xla_layout
from .manual_axes import varying_like

# Chunks per step of the scans over chunks: small enough that a step's
# [S, B, H, C, D] intermediates stay in cache, large enough to amortise the
# step (the measured choice: benchmarks/README.md, "Numbers behind the
# kernels' comments").
SUPER_BLOCK = 4


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


class Blocks(NamedTuple):
    """One super-block's inputs in the chunk layout [S, B, Hv, C, *] (q, k
    repeated to the value heads), seg: chunk_math.ChunkSegments of the same
    layout or None."""
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


@dataclasses.dataclass(frozen=True)
class Padded:
    """Inputs in the contract layout, time zero-padded to NB S C tokens and
    in their own dtypes: q, k [B, Tp, Hk, Dk], v [B, Tp, Hv, Dv], g, beta
    [B, Tp, Hv]; doc, start [B, Tp, Hv] (layout.segment_scalars) or None.
    chunk, per_block (S), group (G = Hv / Hk) and acc (the accumulation
    dtype) are static."""
    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    doc: jax.Array | None
    start: jax.Array | None
    chunk: int
    per_block: int
    group: int
    acc: object

    @property
    def num_blocks(self) -> int:
        return self.v.shape[1] // (self.chunk * self.per_block)

    def zeros_like_rows(self, y, width: int, *refs):
        """Zeros [B, Tp, H, width] in the accumulation dtype, H = y.shape[2]:
        a buffer the scans write one super-block of rows at a time (a scan
        carry: under shard_map it varies like the inputs and refs)."""
        zeros = jnp.zeros(self.v.shape[:2] + (y.shape[2], width), self.acc)
        return varying_like(zeros, self.q, self.k, self.v, self.g, self.beta, *refs)

    def write_rows(self, buf, rows, i):
        """buf [B, Tp, H, D] with super-block i's rows [B, S C, H, D] written
        in place (a scan carry updated in place, no stacked copy)."""
        return lax.dynamic_update_slice_in_dim(buf, rows, i * self.chunk * self.per_block, axis=1)


def pad_inputs(q, k, v, g, beta, seg, chunk) -> Padded:
    """Padded inputs for the scans over super-blocks; seg:
    segments.Segments of packed documents, or None."""
    acc = cm.accumulation_dtype(v.dtype)
    _, per_block = xla_layout.blocks_of(q.shape[1], chunk, SUPER_BLOCK)
    span = chunk * per_block
    doc = start = None
    if seg is not None:
        doc, start = layout.segment_scalars(seg, v.shape[2], span, acc)
    q, k, v, g, beta = (layout.pad_time(x, span) for x in (q, k, v, g, beta))
    return Padded(q, k, v, g, beta, doc, start, chunk, per_block, v.shape[2] // q.shape[2], acc)


def block_inputs(x: Padded, i) -> Blocks:
    """Super-block i (a traced int32) of the padded inputs, in the chunk layout."""
    shape = (x.chunk, x.per_block, x.acc)

    def scalars(y):
        return xla_layout.scalars_block_at(y, i, *shape)

    seg = None
    if x.doc is not None:
        seg = cm.ChunkSegments(doc=scalars(x.doc), start=scalars(x.start))
    return Blocks(xla_layout.block_at(x.q, i, *shape, x.group),
                  xla_layout.block_at(x.k, i, *shape, x.group),
                  xla_layout.block_at(x.v, i, *shape), scalars(x.g), scalars(x.beta), seg)


def _block_indices(x: Padded):
    """The scans' xs: super-block numbers 0 .. NB-1 (int32)."""
    return jnp.arange(x.num_blocks, dtype=jnp.int32)


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


def forward(q, k, v, g, beta, s0, scale, settings, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; settings: backends.KernelSettings (its chunk);
    seg: segments.Segments or None (padding already zeroed by the caller).
    Returns (o [B, T, Hv, Dv] accumulation dtype, final state
    [B, Hv, Dk, Dv], ChunkResiduals [NB, S, B, Hv, ...])."""
    x = pad_inputs(q, k, v, g, beta, seg, settings.chunk)
    s0 = varying_like(s0.astype(x.acc), q, k, v, g, beta)   # under shard_map: varies like them

    def step(carry, i):
        s, o = carry
        s_end, (o_block, res) = block_forward(s, block_inputs(x, i), scale)
        return (s_end, x.write_rows(o, xla_layout.block_to_rows(o_block), i)), res

    o = x.zeros_like_rows(v, v.shape[3], s0)
    (s_final, o), chunks = lax.scan(step, (s0, o), _block_indices(x))
    return o[:, :q.shape[1]], s_final, chunks


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


def block_backward(ds1, blk: Blocks, res: ChunkResiduals, do, scale):
    """One step of the backward scan, do [S, B, Hv, C, Dv]: (dS entering the
    block, ChunkGrads of its S chunks)."""
    bwd = _vmap_n(_backward_terms, 3, in_axes=(0,) * 5 + (None,))(
        blk.q, blk.g, blk.seg, res, do, scale)
    ds0, ds_ends, d_new = cotangent_pass(ds1, blk.k, bwd)
    grads = _vmap_n(cm.chunk_backward, 3, in_axes=(0,) * 10 + (None,))(
        blk.q, blk.k, blk.v, blk.beta, res.states, res.new_values, do, ds_ends, d_new, bwd,
        scale)
    return ds0, grads


def grads_to_rows(grads: cm.ChunkGrads, group: int) -> cm.ChunkGrads:
    """One block's ChunkGrads [S, B, Hv, C, *] -> its tokens [B, S C, H, D]
    (dg, dbeta [B, S C, Hv, 1]); dq, dk summed over each key head's value
    heads."""
    dq = layout.sum_head_groups(xla_layout.block_to_rows(grads.dq), group)
    dk = layout.sum_head_groups(xla_layout.block_to_rows(grads.dk), group)
    return cm.ChunkGrads(dq, dk, *(xla_layout.block_to_rows(d) for d in grads[2:]))


def backward(q, k, v, g, beta, res: ChunkResiduals, do, ds_final, scale, settings, seg=None):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. q, k, v, g, beta, seg as given to `forward`; do [B, T, Hv,
    Dv], ds_final [B, Hv, Dk, Dv] (padding cotangents are zeroed by the
    caller)."""
    chunk = settings.chunk
    x = pad_inputs(q, k, v, g, beta, seg, chunk)
    do = layout.pad_time(do, chunk * x.per_block)
    ds_final = varying_like(ds_final.astype(x.acc), res, do)

    def step(carry, xs):
        ds, grads = carry
        i, res_i = xs
        do_i = xla_layout.block_at(do, i, x.chunk, x.per_block, x.acc)
        ds0, block_grads = block_backward(ds, block_inputs(x, i), res_i, do_i, scale)
        rows = grads_to_rows(block_grads, x.group)
        return (ds0, cm.ChunkGrads(*(x.write_rows(d, r, i) for d, r in zip(grads, rows)))), None

    refs = (res, do, ds_final)
    grads = cm.ChunkGrads(*(x.zeros_like_rows(y, y.shape[3], *refs) for y in (q, k, v)),
                          x.zeros_like_rows(g, 1, *refs), x.zeros_like_rows(beta, 1, *refs))
    (ds_initial, grads), _ = lax.scan(step, (ds_final, grads), (_block_indices(x), res),
                                      reverse=True)
    t = q.shape[1]
    dq, dk, dv = (d[:, :t] for d in grads[:3])
    dg, dbeta = (d[:, :t, :, 0] for d in grads[3:])
    return dq, dk, dv, dg, dbeta, ds_initial
