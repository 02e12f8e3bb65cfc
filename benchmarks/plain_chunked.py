"""The baseline a JAX user would write first: a chunked gated delta rule in
plain JAX, differentiated by `jax.grad` (benchmark impl "plain-chunked").

Written from the algorithm, not from our kernels: per chunk of C tokens,
the cumulative log decay G (a float32 cumsum of g), the WY factors by one
triangular solve, then a `lax.scan` over chunks carrying the state. No
custom VJP, no exact-decay tricks: under strong decay its differences of
cumulative sums lose precision, which the benchmark's accuracy rows show.

Per chunk, with S0 the incoming state [Dk, Dv] and Gam[i, j] = exp(G_i - G_j):
  A    = strict_lower(beta_i (k_i . k_j) Gam[i, j])
  E    = (I + A)^-1 (beta V - (beta e^G K) S0)         the delta-rule errors
         ((I + A)^-1 by one triangular solve against I, then matmuls)
  o    = scale ((e^G Q) S0 + lower(Q K^T * Gam) E)
  S_C  = e^(G_C) S0 + (e^(G_C - G) K)^T E
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _to_chunks(x, chunk: int):
    """[B, T, H, ...] -> [N, B, H, C, ...] (T zero-padded to N * C)."""
    b, t = x.shape[:2]
    n = -(-t // chunk)
    x = jnp.pad(x, [(0, 0), (0, n * chunk - t)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, n, chunk) + x.shape[2:])
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 2, 3)      # [N, B, C, H, ...] -> [N, B, H, C, ...]


def chunked_gated_delta_rule(q, k, v, g, beta, scale: float, chunk: int = 64):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv] (any float
    dtype; computed in float32). Zero initial state. Returns (o [B, T, Hv, Dv]
    float32, final state [B, Hv, Dk, Dv] float32)."""
    f32 = jnp.float32
    bsz, t, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    q = jnp.repeat(q.astype(f32), hv // hk, axis=2)
    k = jnp.repeat(k.astype(f32), hv // hk, axis=2)
    q, k, v = (_to_chunks(x, chunk) for x in (q, k, v.astype(f32)))
    g, beta = (_to_chunks(x.astype(f32), chunk) for x in (g, beta))   # [N, B, H, C]

    G = jnp.cumsum(g, axis=-1)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    strict = jnp.tril(jnp.ones((chunk, chunk), bool), -1)
    diff = G[..., :, None] - G[..., None, :]
    gam = jnp.exp(jnp.where(lower, diff, -jnp.inf))                   # 0 above the diagonal
    kk = jnp.einsum("...id,...jd->...ij", k, k)
    a = jnp.where(strict, beta[..., None] * kk * gam, 0.0)
    eye = jnp.eye(chunk, dtype=f32)
    # The inverse as one solve against the identity (a constant: its only
    # cotangent path is through a, one transposed solve in the backward),
    # then u, w by matmuls. Solving against [beta v | beta e^G k] instead
    # deadlocks XLA:CPU on a 2-core machine: jax.grad transposes the a- and
    # b-paths of that solve into two independent LAPACK trsm calls, each
    # occupying one of the two intra-op threads while it waits for its own
    # batch split (jaxlib's ParallelBatchMap) on the same pool.
    tinv = jax.scipy.linalg.solve_triangular(eye + a, jnp.broadcast_to(eye, a.shape),
                                             lower=True, unit_diagonal=True)
    u = tinv @ (beta[..., None] * v)
    w = tinv @ ((beta * jnp.exp(G))[..., None] * k)
    qk = jnp.where(lower, jnp.einsum("...id,...jd->...ij", q, k) * gam, 0.0)
    q_dec = jnp.exp(G)[..., None] * q
    k_tail = jnp.exp(G[..., -1:] - G)[..., None] * k
    g_last = jnp.exp(G[..., -1])

    def step(s, xs):
        u_c, w_c, qk_c, q_c, k_c, d_c = xs
        e = u_c - w_c @ s
        o = scale * (q_c @ s + qk_c @ e)
        s = d_c[..., None, None] * s + jnp.swapaxes(k_c, -1, -2) @ e
        return s, o

    s0 = jnp.zeros((bsz, hv, dk, dv), f32)
    s_final, o = lax.scan(step, s0, (u, w, qk, q_dec, k_tail, g_last))
    o = jnp.moveaxis(o, 0, 1)                                   # [B, N, H, C, Dv]
    o = jnp.swapaxes(o, 2, 3).reshape(bsz, -1, hv, dv)[:, :t]
    return o, s_final
