"""Packed documents and padding (docs/contract.md section 6), as the kernels
see them: per-token masks computed once from `segment_ids` with traced ops
(one compiled program serves every layout of a shape).

  pad   [B, T] bool   id 0: an identity step, output and cotangents exactly 0
  doc   [B, T] int32  document number within the row: 0 for the row's first
                      document (which continues the incoming state), +1 at
                      every later document; padding keeps the number before it
  start [B, T] bool   the token starts a later document (state and conv
                      history are zeroed before it)

The recurrence reads doc/start through chunk_math.ChunkSegments; the conv
reads ConvWindows: windows over the row with its padding deleted (compact
positions) behind the incoming conv history, cut at document starts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax


class Segments(NamedTuple):
    """pad, doc, start: see the module docstring."""
    pad: jnp.ndarray
    doc: jnp.ndarray
    start: jnp.ndarray


def from_ids(segment_ids) -> Segments:
    """Segments of segment_ids [B, T] (int, 0 = padding).

    A non-padding token starts a later document when the nearest non-padding
    token before it has another id (ids 1,1,0,0,1 are one document)."""
    ids = segment_ids.astype(jnp.int32)
    t = ids.shape[1]
    real = ids > 0
    index = lax.broadcasted_iota(jnp.int32, ids.shape, 1)
    last_real = lax.cummax(jnp.where(real, index, -1), axis=1)         # <= t, inclusive
    before = jnp.concatenate([jnp.full_like(last_real[:, :1], -1), last_real[:, :t - 1]],
                             axis=1)                                  # strictly before t
    prev_id = jnp.take_along_axis(ids, jnp.maximum(before, 0), axis=1)
    start = real & (before >= 0) & (prev_id != ids)
    doc = jnp.cumsum(start.astype(jnp.int32), axis=1)
    # computed once: without the barrier XLA fuses this per-token index math
    # into every consumer, e.g. recomputed for each of the conv's channels
    return lax.optimization_barrier(Segments(pad=~real, doc=doc, start=start))


def zero_padding(pad, x):
    """x [B, T, ...] with the rows of padding tokens set to exactly 0
    (a select: NaN or inf padding values cannot leak)."""
    mask = pad.reshape(pad.shape + (1,) * (x.ndim - 2))
    return jnp.where(mask, jnp.zeros((), x.dtype), x)


def zero_padding_all(seg, *xs):
    """zero_padding of every x [B, T, ...] (seg None: xs unchanged)."""
    if seg is None:
        return xs
    return tuple(zero_padding(seg.pad, x) for x in xs)


# --------------------------------------------------------------------------
# conv windows over the row with its padding deleted
# --------------------------------------------------------------------------

class ConvWindows(NamedTuple):
    """Windows of a causal conv of width K over the EXTENDED compact row: the
    K-1 incoming history slots (state.conv, part of the row's first
    document), then the non-padding tokens in order, then the padding slots.

    order     [B, T] int32: token at compact position p (non-padding tokens
              first, in order, then the padding tokens)
    position  [B, T] int32: compact position of token t (0 for padding)
    valid     [K, B, K-1+T] bool: tap j of extended position p reads
              p - (K-1-j) of the same document (tap K-1 is the slot itself,
              valid at every non-padding slot)
    count     [B] int32: non-padding tokens of the row
    tail_keep [B, K-1] bool: extended positions count .. count+K-2 (the
              window of the row's next token) lie in the row's last document"""
    order: jnp.ndarray
    position: jnp.ndarray
    valid: jnp.ndarray
    count: jnp.ndarray
    tail_keep: jnp.ndarray


def _delayed(x, s: int, fill):
    """x[:, p - s] along axis 1, `fill` where p - s < 0. x [B, T], s >= 0."""
    if s == 0:
        return x
    if s >= x.shape[1]:
        return jnp.full_like(x, fill)
    return jnp.concatenate([jnp.full_like(x[:, :s], fill), x[:, :-s]], axis=1)


def conv_windows(seg: Segments, width: int) -> ConvWindows:
    """The extended compact windows of a causal conv of width K."""
    order = jnp.argsort(seg.pad, axis=1, stable=True).astype(jnp.int32)
    position = jnp.maximum(jnp.cumsum(~seg.pad, axis=1, dtype=jnp.int32) - 1, 0)
    doc_c = jnp.take_along_axis(jnp.where(seg.pad, -1, seg.doc), order, axis=1)
    doc_x = jnp.concatenate([jnp.zeros((doc_c.shape[0], width - 1), doc_c.dtype), doc_c],
                            axis=1)   # K-1 history slots, also when T < K-1
    valid = [(_delayed(doc_x, width - 1 - j, -2) == doc_x) & (doc_x >= 0)
             for j in range(width)]
    count = jnp.sum(~seg.pad, axis=1, dtype=jnp.int32)
    tail = count[:, None] + jnp.arange(width - 1, dtype=jnp.int32)
    tail_keep = jnp.take_along_axis(doc_x, tail, axis=1) == seg.doc[:, -1:]
    # computed once (see from_ids): the conv backward's gathers and masked
    # taps otherwise fuse the cumsum, index bounds and document comparisons
    # into one per-channel loop, several times slower than the unpacked conv
    # (benchmarks/README.md, "Numbers behind the kernels' comments")
    return lax.optimization_barrier(
        ConvWindows(order=order, position=position, valid=jnp.stack(valid),
                    count=count, tail_keep=tail_keep))


def to_compact(x, win: ConvWindows, pad):
    """x [B, T, C] -> compact [B, T, C]: non-padding tokens moved to the
    front in order, padding slots exactly 0."""
    return jnp.take_along_axis(zero_padding(pad, x), win.order[..., None], axis=1)


def from_compact(xc, win: ConvWindows, pad):
    """Inverse of to_compact: [B, T, C] compact -> token order, padding 0."""
    return zero_padding(pad, jnp.take_along_axis(xc, win.position[..., None], axis=1))
