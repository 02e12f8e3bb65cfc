"""The chunked gated delta rule in plain JAX (XLA): forward and hand-written
backward, built from the per-chunk functions of `chunk_math`.

State-independent work (decay, triangular inverse, WY factors, intra-chunk
attention) is vmapped over all chunks at once; only the [Dk, Dv] state (and,
backwards, its cotangent) is carried by a scan over chunks.
Residuals saved by the forward: the inverse of every chunk and the state
entering every chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from . import chunk_math as cm
from . import layout


class Residuals(NamedTuple):
    """tinv [N, B, Hv, C, C], states [N, B, Hv, Dk, Dv] (state entering each
    chunk), both in the accumulation dtype."""
    tinv: jnp.ndarray
    states: jnp.ndarray


def _vmap_n(fn, depth: int, in_axes=0):
    for _ in range(depth):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


def _chunked_inputs(q, k, v, g, beta, chunk, acc):
    """Contract layout -> chunked layout, key heads repeated to value heads."""
    group = v.shape[2] // q.shape[2]
    qc = layout.to_chunks(layout.repeat_heads(q, group), chunk, acc)
    kc = layout.to_chunks(layout.repeat_heads(k, group), chunk, acc)
    vc = layout.to_chunks(v, chunk, acc)
    gc = layout.scalars_to_chunks(g, chunk, acc)
    bc = layout.scalars_to_chunks(beta, chunk, acc)
    return qc, kc, vc, gc, bc


def forward(q, k, v, g, beta, s0, scale, chunk):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    s0 [B, Hv, Dk, Dv]. Returns (o [B, T, Hv, Dv] accumulation dtype,
    final state [B, Hv, Dk, Dv], Residuals)."""
    acc = cm.accumulation_dtype(v.dtype)
    t = q.shape[1]
    qc, kc, vc, gc, bc = _chunked_inputs(q, k, v, g, beta, chunk, acc)
    intra = _vmap_n(cm.chunk_intra, 3)(kc, vc, gc, bc)

    def step(s, xs):
        k_n, intra_n = xs
        new_values, s1 = _vmap_n(cm.chunk_state_step, 2)(s, k_n, intra_n)
        return s1, (s, new_values)

    s_final, (states, new_values) = lax.scan(step, s0.astype(acc), (kc, intra))
    oc = _vmap_n(cm.chunk_output, 3, in_axes=(0, 0, 0, 0, 0, None))(
        qc, kc, states, new_values, intra.dec, scale)
    return layout.from_chunks(oc, t), s_final, Residuals(intra.tinv, states)


def backward(q, k, v, g, beta, res: Residuals, do, ds_final, scale, chunk):
    """Cotangents (dq, dk, dv, dg, dbeta, ds0) in the accumulation dtype,
    from the residuals of `forward`; dq, dk summed over each key head's
    value heads. do [B, T, Hv, Dv], ds_final [B, Hv, Dk, Dv]."""
    acc = cm.accumulation_dtype(v.dtype)
    t = q.shape[1]
    group = v.shape[2] // q.shape[2]
    qc, kc, vc, gc, bc = _chunked_inputs(q, k, v, g, beta, chunk, acc)
    doc = layout.to_chunks(do, chunk, acc)
    dec = _vmap_n(cm.chunk_decay, 3)(gc)
    intra = _vmap_n(cm.chunk_wy_factors, 3)(kc, vc, bc, dec, res.tinv)
    p = _vmap_n(cm.chunk_attention, 3)(qc, kc, dec)
    terms = _vmap_n(cm.chunk_cotangent_terms, 3, in_axes=(0, 0, 0, 0, None))(
        qc, p, doc, dec, scale)

    def step(ds1, xs):
        k_n, intra_n, terms_n = xs
        _, ds0 = _vmap_n(cm.chunk_state_cotangent_step, 2)(ds1, k_n, intra_n, terms_n)
        return ds0, ds1

    ds_initial, ds_ends = lax.scan(step, ds_final.astype(acc), (kc, intra, terms),
                                   reverse=True)
    grads = _vmap_n(cm.chunk_backward, 3,
                    in_axes=(0, 0, 0, 0, 0, 0, 0, 0, 0, None))(
        qc, kc, vc, gc, bc, res.states, res.tinv, doc, ds_ends, scale)
    dq = layout.sum_head_groups(layout.from_chunks(grads.dq, t), group)
    dk = layout.sum_head_groups(layout.from_chunks(grads.dk, t), group)
    dv = layout.from_chunks(grads.dv, t)
    dg = layout.scalars_from_chunks(grads.dg, t)
    dbeta = layout.scalars_from_chunks(grads.dbeta, t)
    return dq, dk, dv, dg, dbeta, ds_initial
