"""The gated delta rule token by token: the decode path (docs/contract.md
section 7). A call with T <= RECURRENT_MAX_T takes this path instead of a
chunked backend, for every impl: nothing is padded up to a chunk, and a
single-token step is one read and one write of the [Dk, Dv] state per head.

A deliberate choice for impl="pallas" too: a decode step is a memory-bound
matrix-vector product per head that XLA fuses into one pass over the state;
a Pallas kernel would add a launch and a state copy around the same pass.

Backend interface of `backends` (forward / backward). The backward is JAX's
reverse mode of `forward`'s few unrolled steps, recomputed from the inputs
(decode is rarely differentiated, and T is small by construction).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import layout
from .chunk_math import accumulation_dtype

RECURRENT_MAX_T = 4


class Residuals(NamedTuple):
    """s0 [B, Hv, Dk, Dv]: the incoming state (the steps are recomputed)."""
    s0: jnp.ndarray


def delta_step(s, q_t, k_t, v_t, g_t, beta_t, scale):
    """One token: decay, delta-rule write, read. s [B, H, Dk, Dv];
    q_t, k_t [B, H, Dk]; v_t [B, H, Dv]; g_t, beta_t [B, H].
    Returns (new state, o_t [B, H, Dv]).

    A step is memory-bound (the state is the big operand), so the state is
    read once for both of its products and once more for the update:
      S' = e^g S + k u^T,  u = beta (v - e^g S^T k)
      o  = scale S'^T q = scale (e^g S^T q + (k . q) u)."""
    decay = jnp.exp(g_t)[..., None]                                   # [B, H, 1]
    reads = jnp.einsum("bhkv,bhnk->bhnv", s, jnp.stack([k_t, q_t], axis=2))
    u = beta_t[..., None] * (v_t - decay * reads[:, :, 0])
    s = decay[..., None] * s + jnp.einsum("bhk,bhv->bhkv", k_t, u)
    o = scale * (decay * reads[:, :, 1] + jnp.sum(k_t * q_t, axis=-1, keepdims=True) * u)
    return s, o


def _run(q, k, v, g, beta, s0, scale, start):
    """The unrolled steps in the accumulation dtype; start [B, T] bool or
    None: the state is zeroed before a token that starts a document."""
    acc = accumulation_dtype(v.dtype)
    group = v.shape[2] // q.shape[2]
    q, k = layout.repeat_heads(q, group), layout.repeat_heads(k, group)
    s = s0.astype(acc)
    outs = []
    for t in range(q.shape[1]):
        if start is not None:
            s = jnp.where(start[:, t, None, None, None], jnp.zeros((), acc), s)
        s, o_t = delta_step(s, q[:, t].astype(acc), k[:, t].astype(acc),
                            v[:, t].astype(acc), g[:, t].astype(acc),
                            beta[:, t].astype(acc), scale)
        outs.append(o_t)
    return jnp.stack(outs, axis=1), s


def forward(q, k, v, g, beta, s0, scale, settings, seg=None):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]; seg: segments.Segments or None (padding zeroed by
    the caller: identity steps). Returns (o [B, T, Hv, Dv], final state,
    Residuals), accumulation dtype. `settings` (backends.KernelSettings) is
    unused."""
    del settings
    o, s = _run(q, k, v, g, beta, s0, scale, None if seg is None else seg.start)
    return o, s, Residuals(s0)


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, settings, seg=None):
    """(dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype: reverse mode
    of `forward`'s steps (dq, dk summed over each key head's value heads)."""
    del settings
    acc = accumulation_dtype(v.dtype)
    start = None if seg is None else seg.start

    def run(*args):
        return _run(*args, scale, start)

    primals = tuple(x.astype(acc) for x in (q, k, v, g, beta, res.s0))
    _, vjp = jax.vjp(run, *primals)
    return vjp((do.astype(acc), ds_final.astype(acc)))
