"""The chunked gated delta rule as Pallas kernels: forward and backward.

Same backend interface and math as `xla_impl` (both call the same per-chunk
functions of `chunk_math`), but every chunk of a block of rows is one grid
step of a `pl.pallas_call` and the recurrent states live in a VMEM scratch in
the accumulation dtype (float32; float64 for float64 inputs).

Kernel layout: the token arrays stay in the contract layout, heads side by
side in the last dim (a free reshape of [B, T, H, D]), time padded to a chunk
multiple with identity steps k = beta = g = 0 (see layout.pad_time):
  q, k        [B, Tp, Hk Dk]
  v, do, o    [B, Tp, Hv Dv]
  scalars     [B, Hv, Tp, S]   the per-token scalars side by side: g, beta
                               (S = 2), then doc, start of packed documents
                               (S = 4, chunk_math.ChunkSegments); a chunk's
                               block [Bb, Hb, C, S] holds the [C, 1] inputs of
                               chunk_math (one DMA per chunk for all)
  state       [B, Hv, Dk, Dv]
A grid step works on a block of Bb batch rows and Hb value heads (its P =
Bb Hb value rows; Hb / G key heads), chosen by step_block: a token window is
[Bb, C, Hb D], its lanes the heads' D-wide slices, moved to rows [P, C, D]
(row b Hb + h) in VMEM by static lane slices (_heads_to_rows) and back for the
outputs (_rows_to_heads), so no pass over memory changes the layout. The
per-chunk math is jax.vmap of the chunk_math functions over the P rows
(batched matmuls), the key rows repeated to the value rows in VMEM (value row
r reads key row r // G). Every window's last two dims are (C, Hb Dv) or
(C, Hb / G Dk) for the tokens, (C, S) or (C, 1) for the scalars, (C, C) or
(Dk, Dv): C a multiple of 8, S and 1 whole dims, and a lane window is the
whole H D or a multiple of 128 lanes, as TPU blocks require.

Inputs stay in HBM (pl.ANY) and are streamed by double-buffered DMAs into
two-slot VMEM buffers (see "chunk streams" below for why); outputs are
ordinary BlockSpec blocks.

Forward grid (B / Bb, Hv / Hb, N), chunk axis last and sequential
("arbitrary"): scratch S [P, Dk, Dv], S = s0 at n == 0; per chunk
chunk_intra -> chunk_state_step -> chunk_output. Writes o and, as residuals,
the inverse of every chunk [B, Hv, N, C, C] and the state entering every
chunk [B, Hv, N, Dk, Dv]; the final state is written at the last chunk.

Backward grid (B / Bb, Hv / Hb, N) walking chunks in reverse (step n works on
chunk N-1-n, output index_map n -> N-1-n): scratch dS [P, Dk, Dv] =
ds_final at n == 0; per chunk chunk_backward_intra (from the cached inverse)
-> chunk_state_cotangent_step (dE and dS0) -> chunk_backward (from the
entering state; the forward recurrence is not redone); dS <- dS0, written out
at the last step. dq, dk are summed over each key head's G value heads in the
kernel and written per key head.
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
    """tinv [B, Hv, N, C, C] inverse of every chunk, states [B, Hv, N, Dk, Dv]
    state entering every chunk; both in the accumulation dtype."""
    tinv: jnp.ndarray
    states: jnp.ndarray


# --------------------------------------------------------------------------
# layout helpers
# --------------------------------------------------------------------------

def _token_input(x, chunk, dtype):
    """[B, T, H, D] -> [B, Tp, H D] in dtype, time padded to a chunk multiple
    (a reshape: no copy unless padded or cast)."""
    x = layout.pad_time(x.astype(dtype), chunk)
    return x.reshape(x.shape[:2] + (-1,))


def _token_output(x, t, heads):
    """[B, Tp, H D] -> [B, T, H, D] (padding dropped)."""
    return x.reshape(x.shape[:2] + (heads, -1))[:, :t]


def _heads_to_rows(x, heads):
    """In a kernel: a window [Bb, C, H D] -> rows [Bb H, C, D] (row b H + h),
    by static lane slices of width D."""
    bb, c, width = x.shape
    d = width // heads
    rows = jnp.stack([x[:, :, h * d:(h + 1) * d] for h in range(heads)], axis=1)
    return rows.reshape(bb * heads, c, d)


def _rows_to_heads(x, heads):
    """In a kernel: rows [Bb H, C, D] -> a window [Bb, C, H D] (_heads_to_rows
    inverted)."""
    x = x.reshape((x.shape[0] // heads, heads) + x.shape[1:])
    return jnp.concatenate([x[:, h] for h in range(heads)], axis=-1)


def _compiler_params():
    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


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
# twice per grid step (benchmarks/README.md, "Numbers behind the kernels'
# comments"). Outputs keep BlockSpecs (written in place, no copy).

class _Stream(NamedTuple):
    """One input streamed chunk by chunk: hbm ref (whole array), VMEM buffer
    [2, *block], and index(c) -> the indexer of chunk c's block in hbm."""
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
    buffer in and out at every step. prefetch_when=True keeps it under pl.when: under
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


def _token_window(batch, lanes, chunk):
    """Indexer of chunk c of a window of a [B, Tp, H D] array: batch rows
    batch = (first, count), lanes = (first, count), first a multiple of
    count (the lane offset of head block j is j times its width)."""
    first, width = lanes
    return lambda c: (pl.ds(*batch), pl.ds(pl.multiple_of(c * chunk, chunk), chunk),
                      pl.ds(pl.multiple_of(first, width), width))


def _head_window(batch, heads, chunk):
    """Indexer of chunk c of batch rows x heads of a [B, H, Tp, S] array."""
    return lambda c: (pl.ds(*batch), pl.ds(*heads),
                      pl.ds(pl.multiple_of(c * chunk, chunk), chunk), slice(None))


def _chunk_window(batch, heads):
    """Indexer of chunk c's blocks of batch rows x heads of a [B, H, N, X, Y]
    array."""
    return lambda c: (pl.ds(*batch), pl.ds(*heads), c, slice(None), slice(None))


def _chunk_index(n_chunks):
    """Chunk of grid step n: n, or N-1-n when n_chunks is given (the grid
    walks chunks in reverse)."""
    return (lambda n: n) if n_chunks is None else (lambda n: n_chunks - 1 - n)


def _token_out_spec(bb, chunk, lanes, n_chunks=None):
    """Output block (Bb, C, lanes) of a [B, Tp, H D] array at head block j."""
    at = _chunk_index(n_chunks)
    return pl.BlockSpec((bb, chunk, lanes), lambda i, j, n: (i, at(n), j))


def _scalar_out_spec(bb, hb, chunk, n_chunks):
    """Output block (Bb, Hb, C, 1) of a [B, Hv, Tp, 1] array."""
    at = _chunk_index(n_chunks)
    return pl.BlockSpec((bb, hb, chunk, 1), lambda i, j, n: (i, j, at(n), 0))


def _chunk_out_spec(bb, hb, x, y):
    """Output block (Bb, Hb, x, y) of chunk n of a [B, Hv, N, x, y] array."""
    return pl.BlockSpec((bb, hb, None, x, y), lambda i, j, n: (i, j, n, 0, 0))


def _state_out_spec(bb, hb, dk, dv):
    """Output block (Bb, Hb, Dk, Dv) of a [B, Hv, Dk, Dv] array, the same at
    every chunk (written at the last one)."""
    return pl.BlockSpec((bb, hb, dk, dv), lambda i, j, n: (i, j, 0, 0))


_HBM = pl.BlockSpec(memory_space=pl.ANY)


# --------------------------------------------------------------------------
# what both kernels share: grid position, token streams, inputs, call
# --------------------------------------------------------------------------

# Value rows (batch row, value head) a grid step works on: the most whose
# [Dk, Dv] states fit KernelSettings.state_bytes_per_step. Where only the
# whole width is a legal lane window (D not a multiple of 128 and several
# key heads), a step takes all Hv heads of one batch row, over that budget.
# The step's per-chunk math is vmapped over its rows: batched matmuls, and
# fewer grid steps (each interpreted grid step is ~100 small XLA ops).
LANES = 128   # a TPU lane tile: a window narrower than its array's last dim is a multiple


def step_block(bsz: int, hv: int, group: int, dk: int, dv: int, itemsize: int,
               state_bytes: int):
    """(Bb, Hb): batch rows and value heads a grid step works on, Bb | B,
    Hb | Hv, Hb a multiple of G (whole key heads). The most value rows Bb Hb
    whose states fit state_bytes (the most heads first) among the
    head blocks whose lane windows are legal TPU blocks (Hb = Hv, or Hb Dv
    and Hb / G Dk multiples of LANES); the smallest legal block if none fits."""
    def lanes_ok(hb):
        return hb == hv or (hb * dv % LANES == 0 and hb // group * dk % LANES == 0)

    heads = [hb for hb in range(group, hv + 1, group) if hv % hb == 0 and lanes_ok(hb)]
    blocks = [(bb, hb) for hb in heads for bb in range(1, bsz + 1) if bsz % bb == 0]
    fits = [blk for blk in blocks if blk[0] * blk[1] * dk * dv * itemsize
            <= state_bytes]
    if not fits:
        return 1, min(heads)
    return max(fits, key=lambda blk: (blk[0] * blk[1], blk[1]))


def _grid_position():
    """(i, j, n, n_chunks): batch block, head block, grid step on the chunk
    axis, number of chunks."""
    return pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.num_programs(2)


class _Dims(NamedTuple):
    bsz: int
    t: int
    hk: int
    hv: int
    dk: int
    dv: int
    group: int
    n_chunks: int
    tp: int
    bb: int         # batch rows a grid step works on
    hb: int         # value heads a grid step works on

    @property
    def kb(self) -> int:
        """Key heads a grid step works on."""
        return self.hb // self.group

    @property
    def rows(self) -> int:
        """Value rows P = Bb Hb of a grid step."""
        return self.bb * self.hb

    @property
    def key_width(self) -> int:
        """Lanes of a step's q, k windows (its key heads side by side)."""
        return self.kb * self.dk

    @property
    def value_width(self) -> int:
        """Lanes of a step's v, do, o windows."""
        return self.hb * self.dv

    def batch(self, i):
        return i * self.bb, self.bb

    def heads(self, j):
        return j * self.hb, self.hb

    def key_lanes(self, j):
        return j * self.key_width, self.key_width

    def value_lanes(self, j):
        return j * self.value_width, self.value_width


def _dims(q, v, chunk, acc, state_bytes: int) -> _Dims:
    bsz, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // hk
    n_chunks = layout.num_chunks(t, chunk)
    bb, hb = step_block(bsz, hv, group, dk, dv, jnp.dtype(acc).itemsize, state_bytes)
    return _Dims(bsz, t, hk, hv, dk, dv, group, n_chunks, n_chunks * chunk, bb, hb)


def _token_streams(i, j, d: _Dims, chunk, hbm, buf):
    """The token streams both kernels read, in the order q, k, v, scalars:
    the step's batch rows, its key heads' lanes of q and k, its value heads'
    lanes of v and its value heads of the scalars. hbm, buf: the HBM refs
    and the two-slot VMEM buffers, in that order."""
    batch = d.batch(i)
    index = (_token_window(batch, d.key_lanes(j), chunk),) * 2 + (
        _token_window(batch, d.value_lanes(j), chunk), _head_window(batch, d.heads(j), chunk))
    return tuple(_Stream(*x) for x in zip(hbm, buf, index))


N_TOKEN_STREAMS = 4


def _token_scratch(d: _Dims, chunk, acc, packed):
    """The two-slot VMEM buffers of the token streams."""
    return [pltpu.VMEM((2, d.bb, chunk, d.key_width), acc)] * 2 + [
        pltpu.VMEM((2, d.bb, chunk, d.value_width), acc),
        pltpu.VMEM((2, d.bb, d.hb, chunk, 4 if packed else 2), acc)]


def _token_inputs(q, k, v, g, beta, chunk, acc, seg):
    """q, k, v and the scalars (g, beta, and doc, start of packed documents
    when seg is not None) in the kernel layout (time padded)."""
    columns = [g, beta]
    if seg is not None:
        columns += list(layout.segment_scalars(seg, v.shape[2], chunk, acc))
    scalars = jnp.stack([layout.pad_time(c.astype(acc), chunk) for c in columns], axis=-1)
    return tuple(_token_input(x, chunk, acc) for x in (q, k, v)) + (
        jnp.swapaxes(scalars, 1, 2),)


def _step_tokens(streams, slot, d: _Dims):
    """The resident chunk of the token streams as rows: q, k [P, C, Dk]
    (key heads repeated to the value rows), v [P, C, Dv], scalars [P, C, S]."""
    q, k, v, scalars = (s.buf[slot] for s in streams)
    q, k = (_heads_to_rows(x, d.kb) for x in (q, k))
    q, k = (layout.repeat_heads(x, d.group, axis=0) for x in (q, k))
    v = _heads_to_rows(v, d.hb)
    return q, k, v, _as_rows(scalars, d)


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


def _call(kernel, name, d: _Dims, out_shape, out_specs, scratch_shapes, inputs, mode):
    """pl.pallas_call over the grid (B / Bb, Hv / Hb, N) of inputs, every one
    left in HBM.

    out_shape: ((shape, dtype), ...); under jax.shard_map the outputs vary
    over the manual mesh axes the inputs vary over (manual_axes), and the
    kernel prefetches under pl.when (see _stream_chunks). mode: the
    resolved GDN_INTERPRET mode (KernelSettings.interpret)."""
    inputs = align_varying(*inputs)
    mat = jax.typeof(inputs[0]).mat
    return pl.pallas_call(
        functools.partial(kernel, prefetch_when=bool(mat.varying)),
        out_shape=tuple(jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mat)
                        for shape, dtype in out_shape),
        grid=(d.bsz // d.bb, d.hv // d.hb, d.n_chunks),
        in_specs=[_HBM] * len(inputs), out_specs=out_specs,
        scratch_shapes=scratch_shapes + [pltpu.SemaphoreType.DMA((2,))],
        compiler_params=_compiler_params(),
        interpret=interpret.pallas_interpret_arg(mode), name=name)(*inputs)


def _state_block(ref, i, j, d: _Dims):
    """A [B, Hv, Dk, Dv] HBM ref's block of the step's rows."""
    return ref.at[pl.ds(*d.batch(i)), pl.ds(*d.heads(j))]


def _as_blocks(x, d: _Dims):
    """Rows [P, ...] -> [Bb, Hb, ...] (the blocks of [B, Hv, ...] arrays)."""
    return x.reshape((d.bb, d.hb) + x.shape[1:])


def _as_rows(x, d: _Dims):
    """[Bb, Hb, ...] -> rows [P, ...]."""
    return x.reshape((d.rows,) + x.shape[2:])


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
    buffers, S scratch, DMA semaphores. Every block holds the step's rows."""
    n = N_TOKEN_STREAMS
    token_hbm, (s0_hbm, o_ref, tinv_ref, states_ref, s_final_ref), token_buf, \
        (s_scr, sems) = _split_refs(refs, (n, 5, n, 2))
    i, j, n, n_chunks = _grid_position()

    @pl.when(n == 0)
    def _init():
        pltpu.sync_copy(_state_block(s0_hbm, i, j, d), s_scr)

    streams = _token_streams(i, j, d, chunk, token_hbm, token_buf)
    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: c, prefetch_when)
    q, k, v, scalars = _step_tokens(streams, slot, d)
    g, beta, seg = _scalar_columns(scalars)

    s0 = _as_rows(s_scr[...], d)
    o, tinv, s1 = jax.vmap(functools.partial(_chunk_forward, scale=scale))(
        q, k, v, g, beta, seg, s0)
    o_ref[...] = _rows_to_heads(o, d.hb)
    tinv_ref[...] = _as_blocks(tinv, d)
    states_ref[...] = s_scr[...]
    s_scr[...] = _as_blocks(s1, d)

    @pl.when(n == n_chunks - 1)
    def _final():
        s_final_ref[...] = s_scr[...]


def forward(q, k, v, g, beta, s0, scale, settings, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; settings: backends.KernelSettings; seg:
    segments.Segments or None (padding already zeroed by the caller).
    Returns (o [B, T, Hv, Dv] accumulation dtype, final state
    [B, Hv, Dk, Dv], Residuals)."""
    acc = cm.accumulation_dtype(v.dtype)
    chunk = settings.chunk
    d = _dims(q, v, chunk, acc, settings.state_bytes_per_step)
    tokens = _token_inputs(q, k, v, g, beta, chunk, acc, seg)
    o, tinv, states, s_final = _call(
        functools.partial(_forward_kernel, d=d, scale=scale, chunk=chunk),
        "gdn_chunk_forward", d,
        out_shape=(
            ((d.bsz, d.tp, d.hv * d.dv), acc),
            ((d.bsz, d.hv, d.n_chunks, chunk, chunk), acc),
            ((d.bsz, d.hv, d.n_chunks, d.dk, d.dv), acc),
            ((d.bsz, d.hv, d.dk, d.dv), acc),
        ),
        out_specs=(
            _token_out_spec(d.bb, chunk, d.value_width),
            _chunk_out_spec(d.bb, d.hb, chunk, chunk),
            _chunk_out_spec(d.bb, d.hb, d.dk, d.dv),
            _state_out_spec(d.bb, d.hb, d.dk, d.dv),
        ),
        scratch_shapes=_token_scratch(d, chunk, acc, seg is not None) + [
            pltpu.VMEM((d.bb, d.hb, d.dk, d.dv), acc),     # state S of every row
        ],
        inputs=(*tokens, s0.astype(acc)), mode=settings.interpret,
    )
    return _token_output(o, d.t, d.hv), s_final, Residuals(tinv, states)


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
    semaphores. Every block holds the step's rows."""
    n_tokens = N_TOKEN_STREAMS
    token_hbm, (states_hbm, tinv_hbm, do_hbm, ds_final_hbm), \
        (dq_ref, dk_ref, dv_ref, dg_ref, dbeta_ref, ds0_ref), token_buf, \
        (states_buf, tinv_buf, do_buf, ds_scr, sems) = _split_refs(
            refs, (n_tokens, 4, 6, n_tokens, 5))
    i, j, n, n_chunks = _grid_position()
    batch, heads = d.batch(i), d.heads(j)

    @pl.when(n == 0)
    def _init():
        pltpu.sync_copy(_state_block(ds_final_hbm, i, j, d), ds_scr)

    streams = _token_streams(i, j, d, chunk, token_hbm, token_buf) + (
        _Stream(states_hbm, states_buf, _chunk_window(batch, heads)),
        _Stream(tinv_hbm, tinv_buf, _chunk_window(batch, heads)),
        _Stream(do_hbm, do_buf, _token_window(batch, d.value_lanes(j), chunk)),
    )
    slot = _stream_chunks(streams, sems, n, n_chunks, lambda c: n_chunks - 1 - c,
                          prefetch_when)
    q, k, v, scalars = _step_tokens(streams[:N_TOKEN_STREAMS], slot, d)
    g, beta, seg = _scalar_columns(scalars)
    s0, tinv = (_as_rows(s.buf[slot], d) for s in streams[N_TOKEN_STREAMS:-1])
    do = _heads_to_rows(streams[-1].buf[slot], d.hb)

    grads, ds0 = jax.vmap(functools.partial(_chunk_backward, scale=scale))(
        q, k, v, g, beta, seg, s0, tinv, do, _as_rows(ds_scr[...], d))
    dq_ref[...] = _rows_to_heads(layout.sum_head_groups(grads.dq, d.group, axis=0), d.kb)
    dk_ref[...] = _rows_to_heads(layout.sum_head_groups(grads.dk, d.group, axis=0), d.kb)
    dv_ref[...] = _rows_to_heads(grads.dv, d.hb)
    dg_ref[...] = _as_blocks(grads.dg, d)
    dbeta_ref[...] = _as_blocks(grads.dbeta, d)
    ds_scr[...] = _as_blocks(ds0, d)

    @pl.when(n == n_chunks - 1)
    def _final():
        ds0_ref[...] = ds_scr[...]


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, settings, seg=None):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. do [B, T, Hv, Dv], ds_final [B, Hv, Dk, Dv]; seg as in
    `forward` (padding cotangents are zeroed by the caller)."""
    acc = cm.accumulation_dtype(v.dtype)
    chunk = settings.chunk
    d = _dims(q, v, chunk, acc, settings.state_bytes_per_step)
    tokens = _token_inputs(q, k, v, g, beta, chunk, acc, seg)
    n = d.n_chunks
    dq, dk_, dv_, dg, dbeta, ds0 = _call(
        functools.partial(_backward_kernel, d=d, scale=scale, chunk=chunk),
        "gdn_chunk_backward", d,
        out_shape=(((d.bsz, d.tp, d.hk * d.dk), acc),) * 2 + (
            ((d.bsz, d.tp, d.hv * d.dv), acc),) + (((d.bsz, d.hv, d.tp, 1), acc),) * 2 + (
            ((d.bsz, d.hv, d.dk, d.dv), acc),),
        out_specs=(_token_out_spec(d.bb, chunk, d.key_width, n),
                   _token_out_spec(d.bb, chunk, d.key_width, n),
                   _token_out_spec(d.bb, chunk, d.value_width, n),
                   _scalar_out_spec(d.bb, d.hb, chunk, n),
                   _scalar_out_spec(d.bb, d.hb, chunk, n),
                   _state_out_spec(d.bb, d.hb, d.dk, d.dv)),
        scratch_shapes=_token_scratch(d, chunk, acc, seg is not None) + [
            pltpu.VMEM((2, d.bb, d.hb, d.dk, d.dv), acc),     # state entering the chunk
            pltpu.VMEM((2, d.bb, d.hb, chunk, chunk), acc),   # cached inverse
            pltpu.VMEM((2, d.bb, chunk, d.value_width), acc),  # do
            pltpu.VMEM((d.bb, d.hb, d.dk, d.dv), acc),        # dS
        ],
        inputs=(*tokens, res.states.astype(acc), res.tinv.astype(acc),
                _token_input(do, chunk, acc), ds_final.astype(acc)),
        mode=settings.interpret,
    )
    t = d.t
    dg, dbeta = (jnp.swapaxes(x[:, :, :t, 0], 1, 2) for x in (dg, dbeta))
    return (_token_output(dq, t, d.hk), _token_output(dk_, t, d.hk),
            _token_output(dv_, t, d.hv), dg, dbeta, ds0)
