"""The chunked gated delta rule as Pallas kernels: forward and backward.

Same backend interface and math as `xla_impl` (both call the same per-chunk
functions of `chunk_math`), but every chunk of a block of rows is one grid
step of a `pl.pallas_call` and the recurrent states live in a VMEM scratch in
the accumulation dtype (float32; float64 for float64 inputs).

Kernel layout (built outside the kernels in the accumulation dtype, time
padded to a chunk multiple with identity steps k = beta = g = 0, see
layout.pad_time); a row is one (batch row, head), row b H + h:
  q, k        [B Hk, Tp, Dk]   value row r reads key row r // G
  v, do       [B Hv, Tp, Dv]
  scalars     [B Hv, Tp, S]    the per-token scalars side by side: g, beta
                               (S = 2), then doc, start of packed documents
                               (S = 4, chunk_math.ChunkSegments); a chunk's
                               block is [P, C, S], its columns the [C, 1]
                               inputs of chunk_math (one DMA per chunk for all)
  state       [B Hv, Dk, Dv]
A grid step works on P value rows (rows_per_step: a multiple of G, so its
key rows are whole, P / G of them) and one chunk; its per-chunk math is
jax.vmap of the chunk_math functions over the P rows (batched matmuls), the
key rows repeated to the value rows in VMEM. Every window, input or output,
is (P, C, D), (P, C, S), (P, C, C) or (P, Dk, Dv): the last two dims are
full array dims or C (a multiple of 8), as TPU blocks require.

Inputs stay in HBM (pl.ANY) and are streamed by double-buffered DMAs into
two-slot VMEM buffers (see "chunk streams" below for why); outputs are
ordinary BlockSpec blocks.

Forward grid (B Hv / P, N), chunk axis last and sequential ("arbitrary"):
  scratch S [P, Dk, Dv], S = s0 at n == 0; per chunk chunk_intra ->
  chunk_state_step -> chunk_output. Writes o and, as residuals, the inverse of
  every chunk [B Hv, N, C, C] and the state entering every chunk
  [B Hv, N, Dk, Dv]; the final state is written at the last chunk.

Backward grid (B Hv / P, N) walking chunks in reverse (step n works on chunk
N-1-n, output index_map n -> N-1-n): scratch dS [P, Dk, Dv] = ds_final at
n == 0; per chunk chunk_backward_intra (from the cached inverse) ->
chunk_state_cotangent_step (dE and dS0) -> chunk_backward (from the entering
state; the forward recurrence is not redone); dS <- dS0, written out at the
last step. dq, dk are summed over each key row's G value rows in the kernel
and written per key row.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import chunk_math as cm
from . import interpret
from . import layout
from .manual_axes import align_varying


class Residuals(NamedTuple):
    """tinv [B Hv, N, C, C] inverse of every chunk, states [B Hv, N, Dk, Dv]
    state entering every chunk (row b Hv + h); both in the accumulation dtype."""
    tinv: jnp.ndarray
    states: jnp.ndarray


# --------------------------------------------------------------------------
# layout helpers (outside the kernels)
# --------------------------------------------------------------------------

def _to_rows(x, chunk, dtype):
    """[B, T, H, D] -> [B H, Tp, D] in dtype (row b H + h), time padded to a
    chunk multiple."""
    x = jnp.swapaxes(layout.pad_time(x.astype(dtype), chunk), 1, 2)
    return x.reshape((-1,) + x.shape[2:])


def _from_rows(x, bsz, t):
    """[B H, Tp, D] -> [B, T, H, D] (padding dropped)."""
    return jnp.swapaxes(x.reshape((bsz, -1) + x.shape[1:]), 1, 2)[:, :t]


def _compiler_params():
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


# --------------------------------------------------------------------------
# double-buffered chunk streams (HBM -> VMEM)
# --------------------------------------------------------------------------
#
# Inputs stay in HBM (memory_space=pl.ANY) and every grid step copies the
# blocks of the NEXT chunk into the other half of a two-slot VMEM buffer while
# computing on the current one (the software pipeline BlockSpecs would build).
# Why not BlockSpec inputs: Pallas' HLO interpreter (interpret=True, the CPU
# mode) carries every blocked input through its grid loop and writes each
# input block back after the step; XLA then copies each whole input array
# twice per grid step (measured: 80 ms for a kernel that only doubles a
# [2, 4, 2048, 64] array; 2 ms with this stream). Outputs keep BlockSpecs
# (written in place, no copy).

class _Stream(NamedTuple):
    """One input streamed chunk by chunk: hbm ref (whole array), VMEM buffer
    [2, rows, cols], and index(c) -> the indexer of chunk c's block in hbm."""
    hbm: object
    buf: object
    index: Callable


def _copy(stream: _Stream, c, slot, sems):
    return pltpu.make_async_copy(stream.hbm.at[stream.index(c)],
                                 stream.buf.at[slot], sems.at[slot])


def _stream_chunks(streams, sems, n, n_chunks, chunk_of, prefetch_when):
    """Make chunk chunk_of(n) resident and prefetch chunk_of(n + 1).

    n is the (sequential, innermost) grid index; slot n % 2 holds step n.
    One DMA semaphore per slot, shared by all streams: every copy into a slot
    is waited for before the slot is read.

    The prefetch is unconditional (the last step fetches its own chunk again
    into the idle slot and waits for it before the kernel ends): under
    pl.when it becomes, in interpret mode, a conditional that copies every
    buffer in and out at every step (measured: 45 ms of op time in the
    backward at B2-T4096-D128). prefetch_when=True keeps it under pl.when: under
    jax.shard_map the interpreter's discharge of a DMA outside a conditional
    slices the varying input with the grid's invariant indices, which JAX
    rejects. Returns the slot."""
    # int32 throughout: under jax_enable_x64 a Python int becomes an int64
    # index, which Mosaic rejects for semaphore / memref slicing.
    zero = jnp.int32(0)
    slot = lax.rem(n, jnp.int32(2))
    last = n_chunks - 1

    @pl.when(n == 0)
    def _first():
        for s in streams:
            _copy(s, chunk_of(zero), zero, sems).start()

    if prefetch_when:
        @pl.when(n < last)
        def _prefetch():
            for s in streams:
                _copy(s, chunk_of(n + 1), 1 - slot, sems).start()
    else:
        ahead = chunk_of(jnp.minimum(n + 1, last))
        for s in streams:
            _copy(s, ahead, 1 - slot, sems).start()

    for s in streams:
        _copy(s, chunk_of(n), slot, sems).wait()

    if not prefetch_when:
        @pl.when(n == last)
        def _drain():
            for s in streams:
                _copy(s, ahead, 1 - slot, sems).wait()

    return slot


def _token_rows(first, count, chunk):
    """Indexer of chunk c of rows first .. first + count - 1 in a [R, Tp, D]
    array."""
    return lambda c: (pl.ds(first, count), pl.ds(pl.multiple_of(c * chunk, chunk), chunk),
                      slice(None))


def _chunk_block(first, count):
    """Indexer of chunk c's blocks of rows first .. first + count - 1 in a
    [R, N, X, Y] array."""
    return lambda c: (pl.ds(first, count), c, slice(None), slice(None))


def _token_out_spec(rows, chunk, d, n_chunks=None):
    """Output block (rows, C, D) of a [R, Tp, D] array; n_chunks given: the
    grid walks chunks in reverse (step n writes chunk N-1-n)."""
    if n_chunks is None:
        return pl.BlockSpec((rows, chunk, d), lambda j, n: (j, n, 0))
    return pl.BlockSpec((rows, chunk, d), lambda j, n: (j, n_chunks - 1 - n, 0))


def _chunk_out_spec(rows, x, y):
    """Output block (rows, x, y) of a [R, N, x, y] array."""
    return pl.BlockSpec((rows, None, x, y), lambda j, n: (j, n, 0, 0))


def _state_out_spec(rows, dk, dv):
    """Output block (rows, Dk, Dv) of a [R, Dk, Dv] array, the same at every
    chunk (written at the last one)."""
    return pl.BlockSpec((rows, dk, dv), lambda j, n: (j, 0, 0))


_HBM = pl.BlockSpec(memory_space=pl.ANY)


# --------------------------------------------------------------------------
# what both kernels share: grid position, token streams, inputs, call
# --------------------------------------------------------------------------

# Value rows (batch row, value head) a grid step works on: the most whose
# [Dk, Dv] states take at most this many bytes (a multiple of G dividing
# B Hv). One step's VMEM is about 10x its states (double-buffered streams and
# output blocks): 512 KiB keeps it near 5 MiB. The step's per-chunk math is
# vmapped over its rows: batched matmuls, and B Hv / rows times fewer grid
# steps (on a CPU each interpreted grid step costs ~100 small XLA ops).
STATE_BYTES_PER_STEP = 512 * 1024


def rows_per_step(rows: int, group: int, dk: int, dv: int, itemsize: int) -> int:
    """Value rows per grid step for R = rows value rows (see
    STATE_BYTES_PER_STEP); at least G, so a step reads whole key rows."""
    fits = [r for r in range(group, rows + 1, group)
            if rows % r == 0 and r * dk * dv * itemsize <= STATE_BYTES_PER_STEP]
    return max(fits, default=group)


def _grid_position():
    """(j, n, n_chunks): block of rows, grid step on the chunk axis, number
    of chunks."""
    return pl.program_id(0), pl.program_id(1), pl.num_programs(1)


def _token_streams(j, d, chunk, hbm, buf):
    """The token streams both kernels read, in the order q, k, v, scalars:
    the step's value rows j P .. j P + P - 1 (P = d.per_step) for v and the
    scalars, their key rows j P / G .. for q and k (value row r reads key
    row r // G: row b Hv + h reads b Hk + h // G). hbm, buf: the HBM refs and
    the two-slot VMEM buffers, in that order."""
    key_rows = d.per_step // d.group
    spans = ((j * key_rows, key_rows),) * 2 + ((j * d.per_step, d.per_step),) * 2
    return tuple(_Stream(x_hbm, x_buf, _token_rows(first, count, chunk))
                 for x_hbm, x_buf, (first, count) in zip(hbm, buf, spans))


N_TOKEN_STREAMS = 4


def _token_scratch(d, chunk, acc, packed):
    """The two-slot VMEM buffers of the token streams."""
    key_rows = d.per_step // d.group
    return [pltpu.VMEM((2, rows, chunk, width), acc) for rows, width in (
        (key_rows, d.dk), (key_rows, d.dk), (d.per_step, d.dv),
        (d.per_step, 4 if packed else 2))]


def _token_inputs(q, k, v, g, beta, chunk, acc, seg):
    """q, k, v and the scalars (g, beta, and doc, start of packed documents
    when seg is not None) in the kernel layout (rows, time padded)."""
    columns = [g, beta]
    if seg is not None:
        columns += list(layout.segment_scalars(seg, v.shape[2], chunk, acc))
    scalars = jnp.stack([layout.pad_time(c.astype(acc), chunk) for c in columns], axis=-1)
    return tuple(_to_rows(x, chunk, acc) for x in (q, k, v, scalars))


def _scalar_columns(scalars):
    """g, beta [..., C, 1] and chunk_math.ChunkSegments (None when not
    packed) from streamed [..., C, S] blocks of scalars."""
    g, beta = scalars[..., 0:1], scalars[..., 1:2]
    seg = cm.ChunkSegments(scalars[..., 2:3], scalars[..., 3:4]) \
        if scalars.shape[-1] == 4 else None
    return g, beta, seg


def _split_refs(refs, sizes):
    """refs cut into consecutive groups of the given sizes."""
    groups, at = [], 0
    for size in sizes:
        groups.append(refs[at:at + size])
        at += size
    return groups


class _Dims(NamedTuple):
    bsz: int
    t: int
    hv: int
    dk: int
    dv: int
    group: int
    n_chunks: int
    tp: int
    rows: int       # value rows B Hv
    per_step: int   # value rows a grid step works on


def _dims(q, v, chunk, acc) -> _Dims:
    bsz, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group, rows = hv // hk, bsz * hv
    n_chunks = layout.num_chunks(t, chunk)
    per_step = rows_per_step(rows, group, dk, dv, jnp.dtype(acc).itemsize)
    return _Dims(bsz, t, hv, dk, dv, group, n_chunks, n_chunks * chunk, rows, per_step)


def _call(kernel, name, d: _Dims, out_shape, out_specs, scratch_shapes, inputs):
    """pl.pallas_call over the grid (B Hv / P, N) of inputs, every one left
    in HBM.

    out_shape: ((shape, dtype), ...); under jax.shard_map the outputs vary
    over the manual mesh axes the inputs vary over (manual_axes), and the
    kernel prefetches under pl.when (see _stream_chunks)."""
    inputs = align_varying(*inputs)
    mat = jax.typeof(inputs[0]).mat
    return pl.pallas_call(
        functools.partial(kernel, prefetch_when=bool(mat.varying)),
        out_shape=tuple(jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat)
                        for shape, dtype in out_shape),
        grid=(d.rows // d.per_step, d.n_chunks),
        in_specs=[_HBM] * len(inputs), out_specs=out_specs,
        scratch_shapes=scratch_shapes + [pltpu.SemaphoreType.DMA((2,))],
        compiler_params=_compiler_params(),
        interpret=interpret.pallas_interpret_arg(), name=name)(*inputs)


# --------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------

def _chunk_forward(q, k, v, g, beta, seg, s0, scale):
    """One row's chunk: (o [C, Dv], tinv [C, C], state after it [Dk, Dv])."""
    intra = cm.chunk_intra(k, v, g, beta, seg)
    new_values, s1 = cm.chunk_state_step(s0, k, intra)
    p = cm.chunk_attention(q, k, intra.dec)
    return cm.chunk_output(q, s0, new_values, p, intra.dec, scale), intra.tinv, s1


def _forward_kernel(*refs, d: _Dims, scale, chunk, prefetch_when):
    """refs: the token inputs, s0; o, tinv, states, s_final; the token
    buffers, S scratch, DMA semaphores. Every block holds the step's P rows."""
    n = N_TOKEN_STREAMS
    token_hbm, (s0_hbm, o_ref, tinv_ref, states_ref, s_final_ref), token_buf, \
        (s_scr, sems) = _split_refs(refs, (n, 5, n, 2))
    j, n, n_chunks = _grid_position()

    @pl.when(n == 0)
    def _init():
        pltpu.sync_copy(s0_hbm.at[pl.ds(j * d.per_step, d.per_step)], s_scr)

    streams = _token_streams(j, d, chunk, token_hbm, token_buf)
    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: c, prefetch_when)
    q, k, v, scalars = (s.buf[slot] for s in streams)
    q, k = (layout.repeat_heads(x, d.group, axis=0) for x in (q, k))
    g, beta, seg = _scalar_columns(scalars)

    s0 = s_scr[...]
    o, tinv, s1 = jax.vmap(functools.partial(_chunk_forward, scale=scale))(
        q, k, v, g, beta, seg, s0)
    o_ref[...] = o
    tinv_ref[...] = tinv
    states_ref[...] = s0
    s_scr[...] = s1

    @pl.when(n == n_chunks - 1)
    def _final():
        s_final_ref[...] = s1


def forward(q, k, v, g, beta, s0, scale, chunk, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; seg: segments.Segments or None (padding already
    zeroed by the caller). Returns (o [B, T, Hv, Dv] accumulation dtype,
    final state [B, Hv, Dk, Dv], Residuals)."""
    acc = cm.accumulation_dtype(v.dtype)
    d = _dims(q, v, chunk, acc)
    tokens = _token_inputs(q, k, v, g, beta, chunk, acc, seg)
    p = d.per_step
    o, tinv, states, s_final = _call(
        functools.partial(_forward_kernel, d=d, scale=scale, chunk=chunk),
        "gdn_chunk_forward", d,
        out_shape=(
            ((d.rows, d.tp, d.dv), acc),
            ((d.rows, d.n_chunks, chunk, chunk), acc),
            ((d.rows, d.n_chunks, d.dk, d.dv), acc),
            ((d.rows, d.dk, d.dv), acc),
        ),
        out_specs=(
            _token_out_spec(p, chunk, d.dv),
            _chunk_out_spec(p, chunk, chunk),
            _chunk_out_spec(p, d.dk, d.dv),
            _state_out_spec(p, d.dk, d.dv),
        ),
        scratch_shapes=_token_scratch(d, chunk, acc, seg is not None) + [
            pltpu.VMEM((p, d.dk, d.dv), acc),         # state S of every row
        ],
        inputs=(*tokens, s0.astype(acc).reshape(d.rows, d.dk, d.dv)),
    )
    return (_from_rows(o, d.bsz, d.t), s_final.reshape(d.bsz, d.hv, d.dk, d.dv),
            Residuals(tinv, states))


# --------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------

def _chunk_backward(q, k, v, g, beta, seg, s0, tinv, do, ds1, scale):
    """One row's chunk: (chunk_math.ChunkGrads, dS entering it [Dk, Dv])."""
    bwd = cm.chunk_backward_intra(q, k, v, g, beta, tinv, do, scale, seg)
    d_new, ds0 = cm.chunk_state_cotangent_step(ds1, k, bwd.intra, bwd.terms)
    grads = cm.chunk_backward(q, k, v, beta, s0, cm.chunk_new_values(bwd.intra, s0), do, ds1,
                              d_new, bwd, scale)
    return grads, ds0


def _backward_kernel(*refs, d: _Dims, scale, chunk, prefetch_when):
    """refs: the token inputs, states, tinv, do, ds_final; dq, dk, dv, dg,
    dbeta, ds0; the token buffers, states/tinv/do buffers, dS scratch, DMA
    semaphores. Every block holds the step's P rows."""
    n_tokens = N_TOKEN_STREAMS
    token_hbm, (states_hbm, tinv_hbm, do_hbm, ds_final_hbm), \
        (dq_ref, dk_ref, dv_ref, dg_ref, dbeta_ref, ds0_ref), token_buf, \
        (states_buf, tinv_buf, do_buf, ds_scr, sems) = _split_refs(
            refs, (n_tokens, 4, 6, n_tokens, 5))
    j, n, n_chunks = _grid_position()
    first = j * d.per_step

    @pl.when(n == 0)
    def _init():
        pltpu.sync_copy(ds_final_hbm.at[pl.ds(first, d.per_step)], ds_scr)

    streams = _token_streams(j, d, chunk, token_hbm, token_buf) + (
        _Stream(states_hbm, states_buf, _chunk_block(first, d.per_step)),
        _Stream(tinv_hbm, tinv_buf, _chunk_block(first, d.per_step)),
        _Stream(do_hbm, do_buf, _token_rows(first, d.per_step, chunk)),
    )
    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: n_chunks - 1 - c,
                          prefetch_when)
    q, k, v, scalars, s0, tinv, do = (s.buf[slot] for s in streams)
    q, k = (layout.repeat_heads(x, d.group, axis=0) for x in (q, k))
    g, beta, seg = _scalar_columns(scalars)

    grads, ds0 = jax.vmap(functools.partial(_chunk_backward, scale=scale))(
        q, k, v, g, beta, seg, s0, tinv, do, ds_scr[...])
    dq_ref[...] = layout.sum_head_groups(grads.dq, d.group, axis=0)
    dk_ref[...] = layout.sum_head_groups(grads.dk, d.group, axis=0)
    dv_ref[...] = grads.dv
    dg_ref[...] = grads.dg
    dbeta_ref[...] = grads.dbeta
    ds_scr[...] = ds0

    @pl.when(n == n_chunks - 1)
    def _final():
        ds0_ref[...] = ds0


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, chunk, seg=None):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. do [B, T, Hv, Dv], ds_final [B, Hv, Dk, Dv]; seg as in
    `forward` (padding cotangents are zeroed by the caller)."""
    acc = cm.accumulation_dtype(v.dtype)
    d = _dims(q, v, chunk, acc)
    p = d.per_step
    tokens = _token_inputs(q, k, v, g, beta, chunk, acc, seg)
    key_rows = d.rows // d.group
    token_grad = lambda rows, width: ((rows, d.tp, width), acc)
    dq, dk_, dv_, dg, dbeta, ds0 = _call(
        functools.partial(_backward_kernel, d=d, scale=scale, chunk=chunk),
        "gdn_chunk_backward", d,
        out_shape=(token_grad(key_rows, d.dk), token_grad(key_rows, d.dk),
                   token_grad(d.rows, d.dv), token_grad(d.rows, 1), token_grad(d.rows, 1),
                   ((d.rows, d.dk, d.dv), acc)),
        out_specs=tuple(_token_out_spec(rows, chunk, width, d.n_chunks) for rows, width in (
            (p // d.group, d.dk), (p // d.group, d.dk), (p, d.dv), (p, 1), (p, 1)))
        + (_state_out_spec(p, d.dk, d.dv),),
        scratch_shapes=_token_scratch(d, chunk, acc, seg is not None) + [
            pltpu.VMEM((2, p, d.dk, d.dv), acc),     # state entering the chunk
            pltpu.VMEM((2, p, chunk, chunk), acc),   # cached inverse
            pltpu.VMEM((2, p, chunk, d.dv), acc),    # do
            pltpu.VMEM((p, d.dk, d.dv), acc),        # dS
        ],
        inputs=(*tokens, res.states.astype(acc), res.tinv.astype(acc),
                _to_rows(do, chunk, acc),
                ds_final.astype(acc).reshape(d.rows, d.dk, d.dv)),
    )

    bsz, t = d.bsz, d.t
    dq, dk_, dv_ = (_from_rows(x, bsz, t) for x in (dq, dk_, dv_))
    dg = _from_rows(dg, bsz, t)[..., 0]
    dbeta = _from_rows(dbeta, bsz, t)[..., 0]
    return dq, dk_, dv_, dg, dbeta, ds0.reshape(bsz, d.hv, d.dk, d.dv)
