"""The contract layout [B, T, H, D] as every backend pads and groups it:
time padded with identity steps to whole chunks, per-token document
scalars, key heads repeated to value heads and their cotangents summed
back. (The XLA twin's super-block layout is xla_layout.)"""

from __future__ import annotations

import jax.numpy as jnp


def num_chunks(t: int, chunk: int) -> int:
    """ceil(T / C)."""
    return -(-t // chunk)


def pad_time(x, chunk: int):
    """Zero-pad axis 1 (time) of x [B, T, ...] up to a multiple of chunk
    (of chunk * S for the scans over super-blocks).

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


def repeat_heads(x, group: int, axis: int = 2):
    """Key heads -> value heads along `axis`: [B, T, Hk, D] -> [B, T, Hk*G, D]
    (value head h reads key head h // G); the Pallas kernels pass axis=0 for
    a step's rows [P / G, C, D] -> [P, C, D] (value row r reads key row r // G)."""
    return x if group == 1 else jnp.repeat(x, group, axis=axis)


def sum_head_groups(dx, group: int, axis: int = 2):
    """Value-head cotangent -> key heads along `axis` (repeat_heads
    transposed): [B, T, Hk*G, D] -> [B, T, Hk, D]."""
    if group == 1:
        return dx
    shape = dx.shape
    grouped = shape[:axis] + (shape[axis] // group, group) + shape[axis + 1:]
    return dx.reshape(grouped).sum(axis=axis + 1)
