"""Moving between the contract layout [B, T, H, D] and the blocked chunk
layout [NB, S, B, H, C, D] (NB super-blocks of S chunks of C tokens, T padded
with identity steps)."""

from __future__ import annotations

import jax.numpy as jnp


def num_chunks(t: int, chunk: int) -> int:
    """ceil(T / C)."""
    return -(-t // chunk)


def pad_time(x, chunk: int):
    """Zero-pad axis 1 (time) of x [B, T, ...] up to a multiple of chunk
    (of chunk * S for the blocked layout).

    Zero k, beta and g make the padded steps identities of the recurrence
    (S' = exp(0) S, no write), so the final state is unaffected."""
    t = x.shape[1]
    extra = num_chunks(t, chunk) * chunk - t
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, extra)
    return jnp.pad(x, widths)


def segment_scalars(seg, heads: int, chunk: int, dtype):
    """Packed-document columns per value head, time padded to a multiple of
    chunk (C, or C * S): (doc, start) [B, Tp, H] in dtype. seg: segments.Segments.

    The padded tail continues the row's last document (doc repeats its last
    value, start 0), so the identity steps there cut nothing."""
    doc = pad_time(seg.doc, chunk)
    if doc.shape[1] > seg.doc.shape[1]:
        t = seg.doc.shape[1]
        doc = doc.at[:, t:].set(seg.doc[:, t - 1:t])
    start = pad_time(seg.start, chunk)
    shape = doc.shape + (heads,)
    return (jnp.broadcast_to(doc[..., None], shape).astype(dtype),
            jnp.broadcast_to(start[..., None], shape).astype(dtype))


def blocks_of(t: int, chunk: int, per_block: int):
    """(NB, S): super-blocks and chunks per block for T tokens, S =
    min(per_block, N) so a short row is one block with no padded chunk."""
    s = max(1, min(per_block, num_chunks(t, chunk)))
    return num_chunks(t, chunk * s), s


def to_blocks(x, chunk: int, per_block: int, dtype):
    """[B, T, H, D] -> [NB, S, B, H, C, D] in dtype (time padded to NB S C)."""
    x = pad_time(x, chunk * per_block).astype(dtype)
    b, tp, h, d = x.shape
    x = x.reshape(b, tp // (chunk * per_block), per_block, chunk, h, d)
    return x.transpose(1, 2, 0, 4, 3, 5)


def scalars_to_blocks(x, chunk: int, per_block: int, dtype):
    """[B, T, H] -> [NB, S, B, H, C, 1] (per-token scalars as columns)."""
    return to_blocks(x[..., None], chunk, per_block, dtype)


def from_blocks(x, t: int):
    """[NB, S, B, H, C, D] -> [B, T, H, D] (padding dropped)."""
    nb, s, b, h, c, d = x.shape
    return x.transpose(2, 0, 1, 4, 3, 5).reshape(b, nb * s * c, h, d)[:, :t]


def scalars_from_blocks(x, t: int):
    """[NB, S, B, H, C, 1] -> [B, T, H]."""
    return from_blocks(x, t)[..., 0]


def repeat_heads(x, group: int):
    """Key heads -> value heads: [B, T, Hk, D] -> [B, T, Hk*G, D]
    (value head h reads key head h // G)."""
    return x if group == 1 else jnp.repeat(x, group, axis=2)


def sum_head_groups(dx, group: int):
    """Value-head cotangent [B, T, Hk*G, D] -> key heads [B, T, Hk, D]."""
    if group == 1:
        return dx
    b, t, hv, d = dx.shape
    return dx.reshape(b, t, hv // group, group, d).sum(axis=3)
