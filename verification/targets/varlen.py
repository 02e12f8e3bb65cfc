"""Packed rows in the conventions kernels use, to and from the contract's
`segment_ids` (docs/contract.md section 6: id 0 is padding, a document
continues over a padding run, each row's first document continues the
incoming state).

Contract -> kernel (what `verification.targets.adapters.adapt(varlen=...)` uses):
padding becomes identity steps (the adapter sets g = 0, beta = 0 there and
drops the kernel's output), so a row of B*T tokens maps onto kernel
sequences whose boundaries are the rows' starts and the documents' starts:

    kernel_sequences(ids)     one KernelSequences (below) for both conventions
    .cu_seqlens               flattened [1, B*T] rows with offsets [N + 1],
                              N = B*T (the number of sequences is data; unused
                              slots are empty sequences at the end)
    .doc_ids                  [B, T]: a row-local document counter where 0 is
                              an ordinary document (the row's first)

Kernel -> contract (for an author's own packed test data):

    segment_ids_from_cu_seqlens(cu_seqlens, total)   [1, total]
    segment_ids_from_doc_ids(doc_ids)                [B, T]

All are jax functions of traced arrays (no Python control flow on values).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax


class KernelSequences(NamedTuple):
    """Where a contract-packed batch's kernel sequences start.

    starts     [B, T] bool: the token opens a kernel sequence (every row's
               first token; every document start after the row's first)
    doc_ids    [B, T] int32: the row-local sequence counter (0, 1, ...)
    flat_index [B, T] int32: the sequence's index over the flattened batch
    cu_seqlens [B*T + 1] int32: sequence offsets in the flattened batch;
               the unused trailing slots are empty sequences at B*T
    """
    starts: jnp.ndarray
    doc_ids: jnp.ndarray
    flat_index: jnp.ndarray
    cu_seqlens: jnp.ndarray

    @property
    def row_first(self):
        """[B]: the flattened sequence index each row starts with."""
        return self.flat_index[:, 0]

    @property
    def row_last(self):
        """[B]: the flattened sequence index each row ends with."""
        return self.flat_index[:, -1]


def padding_mask(segment_ids):
    """[B, T] bool: the padding tokens (id 0)."""
    return jnp.asarray(segment_ids) == 0


def kernel_sequences(segment_ids) -> KernelSequences:
    """The kernel sequences of a packed batch, segment_ids [B, T] (contract
    section 6). Padding before a row's first document belongs to the row's
    first sequence, padding after a document to that document's sequence:
    as identity steps they change no state."""
    ids = jnp.asarray(segment_ids).astype(jnp.int32)
    bsz, t = ids.shape
    is_doc = ids > 0
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bsz, t))
    last_doc = lax.cummax(jnp.where(is_doc, pos, -1), axis=1)     # at or before t
    before = jnp.concatenate([jnp.full((bsz, 1), -1, jnp.int32), last_doc[:, :-1]], axis=1)
    prev_id = jnp.where(before >= 0,
                        jnp.take_along_axis(ids, jnp.maximum(before, 0), axis=1), 0)
    starts = (pos == 0) | (is_doc & (prev_id > 0) & (ids != prev_id))
    doc_ids = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1
    flat_starts = starts.reshape(-1)
    flat_index = (jnp.cumsum(flat_starts, dtype=jnp.int32) - 1).reshape(bsz, t)
    total = bsz * t
    slot = jnp.where(flat_starts, flat_index.reshape(-1), total + 1)   # out of range: dropped
    cu = jnp.full((total + 1,), total, jnp.int32).at[slot].set(
        jnp.arange(total, dtype=jnp.int32), mode="drop")
    return KernelSequences(starts, doc_ids, flat_index, cu)


def segment_ids_from_cu_seqlens(cu_seqlens, total: int):
    """[1, total] contract segment_ids of a flattened row cut at cu_seqlens
    [N + 1] (sequence i is tokens [cu[i], cu[i+1]); empty sequences allowed):
    sequence i is document i + 1, no padding."""
    cu = jnp.asarray(cu_seqlens)
    pos = jnp.arange(total)
    # the number of sequence starts at or before each token (empty ones
    # share a start with the next, so ids may skip values: still distinct)
    ids = jnp.sum(cu[None, 1:-1] <= pos[:, None], axis=1) + 1
    return ids.astype(jnp.int32)[None]


def segment_ids_from_doc_ids(doc_ids):
    """[B, T] contract segment_ids of a row-local document id convention in
    which every id (0 included) is a document and a change of id starts the
    next one: ids 1, 2, ... by position, no padding."""
    ids = jnp.asarray(doc_ids)
    change = jnp.concatenate([jnp.zeros_like(ids[:, :1], dtype=bool),
                              ids[:, 1:] != ids[:, :-1]], axis=1)
    return (jnp.cumsum(change, axis=1) + 1).astype(jnp.int32)
