"""Moving between the contract layout [B, T, H, D] and the chunked layout
[N, B, H, C, D] (N chunks of C tokens, T padded with identity steps)."""

from __future__ import annotations

import jax.numpy as jnp


def num_chunks(t: int, chunk: int) -> int:
    """ceil(T / C)."""
    return -(-t // chunk)


def pad_time(x, chunk: int):
    """Zero-pad axis 1 (time) of x [B, T, ...] up to a multiple of chunk.

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
    """Packed-document columns per value head, time padded to a chunk
    multiple: (doc, start) [B, Tp, H] in dtype. seg: segments.Segments.

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


def to_chunks(x, chunk: int, dtype):
    """[B, T, H, D] -> [N, B, H, C, D] in dtype (time padded)."""
    x = pad_time(x, chunk).astype(dtype)
    b, tp, h, d = x.shape
    return x.reshape(b, tp // chunk, chunk, h, d).transpose(1, 0, 3, 2, 4)


def scalars_to_chunks(x, chunk: int, dtype):
    """[B, T, H] -> [N, B, H, C, 1] (per-token scalars as columns)."""
    return to_chunks(x[..., None], chunk, dtype)


def from_chunks(x, t: int):
    """[N, B, H, C, D] -> [B, T, H, D] (padding dropped)."""
    n, b, h, c, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, n * c, h, d)[:, :t]


def scalars_from_chunks(x, t: int):
    """[N, B, H, C, 1] -> [B, T, H]."""
    return from_chunks(x, t)[..., 0]


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
