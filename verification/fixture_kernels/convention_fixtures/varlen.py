"""A kernel author's gated delta rule over variable-length sequences.

Conventions (different from the contract's):
  * N sequences flattened into ONE row: q, k [1, total, Hk, Dk];
    v [1, total, Hv, Dv] (grouped value heads: head h reads key head
    h // (Hv // Hk)); g (log decay), beta [1, total, Hv];
  * cu_seqlens int32 [N+1], nondecreasing, cu[0] = 0, cu[N] = total;
    sequence i is tokens [cu[i], cu[i+1]); empty sequences are allowed and
    return their initial state unchanged; cu_seqlens may be traced;
  * initial_state [N, Hv, Dk, Dv] float32, one per sequence (required);
    every sequence starts from its own and nothing crosses between them.
Float32 token-by-token lax.scan, plain JAX autodiff.
"""

import jax.numpy as jnp
from jax import lax

# State leaks between sequences: only the very first token resets the state.
# (The pattern is split in two literals so that it occurs once in this file.)
PLANTED_BUG = ("start = t == " "cu[i]", "start = t == cu[0]")

HI = "highest"


def delta_rule_varlen(q, k, v, g, beta, cu_seqlens, initial_state, scale=None):
    """q, k [1, total, Hk, Dk]; v [1, total, Hv, Dv]; g, beta [1, total, Hv];
    cu_seqlens int32 [N+1]; initial_state [N, Hv, Dk, Dv].
    Returns (o [1, total, Hv, Dv] in v's dtype, final_state [N, Hv, Dk, Dv] float32)."""
    total, hk, dk = q.shape[1:]
    hv = v.shape[2]
    scale = dk ** -0.5 if scale is None else scale
    f32 = jnp.float32
    q_, k_ = (jnp.repeat(x[0].astype(f32), hv // hk, axis=1) for x in (q, k))
    v_, g_, b_ = (x[0].astype(f32) for x in (v, g, beta))
    s_init = initial_state.astype(f32)
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    n = cu.shape[0] - 1
    pos = jnp.arange(total, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu, pos, side="right") - 1, 0, n - 1)   # owner of each token

    def step(carry, x):
        s, finals = carry                     # s [Hv, Dk, Dv]; finals [N, Hv, Dk, Dv]
        t, i, q_t, k_t, v_t, g_t, b_t = x
        start = t == cu[i]
        s = jnp.where(start, s_init[i], s)    # a sequence starts from its own state
        s = jnp.exp(g_t)[:, None, None] * s
        err = v_t - jnp.einsum("hkv,hk->hv", s, k_t, precision=HI)
        s = s + jnp.einsum("hk,hv->hkv", k_t, b_t[:, None] * err, precision=HI)
        o_t = scale * jnp.einsum("hkv,hk->hv", s, q_t, precision=HI)
        return (s, finals.at[i].set(s)), o_t  # the last token of sequence i wins

    init = (jnp.zeros_like(s_init[0]), s_init)   # empty sequences keep s_init[i]
    (_, finals), o = lax.scan(step, init, (pos, seq, q_, k_, v_, g_, b_))
    return o[None].astype(v.dtype), finals
