"""The XLA twin's chunk layout: one super-block of S chunks of C tokens,
[S, B, H, C, D], sliced from and written back to the contract layout
[B, T, H, D] one block at a time (T padded with identity steps to NB
super-blocks by layout.pad_time)."""

from __future__ import annotations

from jax import lax

from .layout import num_chunks, repeat_heads


def blocks_of(t: int, chunk: int, per_block: int):
    """(NB, S): super-blocks and chunks per block for T tokens, S =
    min(per_block, N) so a short row is one block with no padded chunk."""
    s = max(1, min(per_block, num_chunks(t, chunk)))
    return num_chunks(t, chunk * s), s


def block_at(x, i, chunk: int, per_block: int, dtype, group: int = 1):
    """Super-block i of x [B, Tp, H, D] (Tp a multiple of C S) in the chunk
    layout [S, B, H*G, C, D], in dtype, heads repeated G = group times
    (repeat_heads). Sliced and transposed one block at a time, so the copy
    stays in cache."""
    span = chunk * per_block
    piece = repeat_heads(lax.dynamic_slice_in_dim(x, i * span, span, axis=1), group)
    b, _, h, d = piece.shape
    return piece.astype(dtype).reshape(b, per_block, chunk, h, d).transpose(1, 0, 3, 2, 4)


def scalars_block_at(x, i, chunk: int, per_block: int, dtype):
    """Per-token scalars [B, Tp, H] -> super-block i as columns [S, B, H, C, 1]."""
    return block_at(x[..., None], i, chunk, per_block, dtype)


def block_to_rows(x):
    """One super-block [S, B, H, C, D] -> its tokens [B, S C, H, D]."""
    s, b, h, c, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, s * c, h, d)
