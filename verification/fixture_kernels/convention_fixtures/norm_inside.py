"""A kernel author's chunked gated delta rule that L2-normalises q and k itself.

Conventions: the contract's layout (q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv];
g (log decay), beta [B, T, Hv]; state [B, Hv, Dk, Dv]; value head h reads
key head h // (Hv // Hk)) BUT q and k are first normalised inside the op:
x <- x * rsqrt(sum(x*x, -1) + QK_NORM_EPS).

Chunked WY / UT form: T is padded to a multiple of chunk_size with identity
steps (g = 0, beta = 0); within a chunk the unit lower-triangular system
A = I + tril(diag(beta) K K^T * decay, -1) is solved by forward substitution;
pairwise decays are segment sums masked to -inf above the diagonal before
exp (safe for g ~ -1e4); lax.scan carries the state between chunks.
Float32 throughout, plain JAX autodiff.
"""

import jax.numpy as jnp
from jax import lax

# not lax.linalg.triangular_solve: jaxlib's batched CPU solve can deadlock
# on a 2-core machine (see its docstring)
from verification.fixture_kernels.foreign_targets.bf16_compute_chunked import solve_unit_lower

QK_NORM_EPS = 1e-6

# The carried state is not decayed by the chunk's total decay.
# (The pattern is split in two literals so that it occurs once in this file.)
PLANTED_BUG = ("jnp.exp(g_tot)" "[..., None, None] * s + ", "s + ")

HI = "highest"


def _l2norm(x):
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + QK_NORM_EPS)


def _segsum(g):
    """g [..., C] -> [..., C, C]: out[i, j] = g_{j+1} + ... + g_i for i >= j
    (log decay from token j to token i), -inf above the diagonal."""
    idx = jnp.arange(g.shape[-1])
    x = jnp.where(idx[:, None] > idx[None, :], g[..., :, None], 0.0)   # x[m, j] = g_m, m > j
    return jnp.where(idx[:, None] >= idx[None, :], jnp.cumsum(x, axis=-2), -jnp.inf)


def _to_chunks(x, n, c):
    """[B, n*c, H, ...] -> [n, B, H, c, ...] (chunk-major, for the scan)."""
    b, _, h = x.shape[:3]
    x = x.reshape((b, n, c, h) + x.shape[3:])
    return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)


def gated_delta_rule_normed(q, k, v, g, beta, *, scale=None, initial_state=None, chunk_size=64):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None (zeros).
    Returns (o [B, T, Hv, Dv] in v's dtype, final_state [B, Hv, Dk, Dv] float32)."""
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    out_dtype = v.dtype
    scale = dk ** -0.5 if scale is None else scale
    c = chunk_size
    n = -(-t // c)
    q, k = (jnp.repeat(_l2norm(x.astype(jnp.float32)), hv // hk, axis=2) for x in (q, k))

    def chunks(x):      # pad with identity steps (all zeros: g = 0, beta = 0)
        pad = [(0, 0), (0, n * c - t)] + [(0, 0)] * (x.ndim - 2)
        return _to_chunks(jnp.pad(x.astype(jnp.float32), pad), n, c)

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))   # [n, B, H, c, ...]
    seg = _segsum(g)                                  # [n, B, H, c, c]
    decay = jnp.exp(seg)                              # exactly 0 above the diagonal
    g_cum = jnp.cumsum(g, axis=-1)                    # log decay chunk start -> i
    kk = jnp.einsum("...ik,...jk->...ij", k, k, precision=HI)
    lower = jnp.tril(jnp.ones((c, c), bool), -1)
    strict = jnp.where(lower, beta[..., None] * kk * decay, 0.0)
    rhs = jnp.concatenate([beta[..., None] * v, (beta * jnp.exp(g_cum))[..., None] * k], -1)
    sol = solve_unit_lower(strict, rhs)
    u, wk = sol[..., :dv], sol[..., dv:]              # new values = u - wk @ S
    attn = jnp.einsum("...ik,...jk->...ij", q, k, precision=HI) * decay
    q_dec = jnp.exp(g_cum)[..., None] * q
    k_dec = jnp.exp(seg[..., -1, :])[..., None] * k   # decay from token j to chunk end
    g_tot = g_cum[..., -1]

    def step(s, x):
        u, wk, attn, q_dec, k_dec, g_tot = x
        w = u - jnp.einsum("bhck,bhkv->bhcv", wk, s, precision=HI)
        o = scale * (jnp.einsum("bhck,bhkv->bhcv", q_dec, s, precision=HI)
                     + jnp.einsum("bhij,bhjv->bhiv", attn, w, precision=HI))
        s = jnp.exp(g_tot)[..., None, None] * s + jnp.einsum(
            "bhck,bhcv->bhkv", k_dec, w, precision=HI)
        return s, o

    s0 = (jnp.zeros((b, hv, dk, dv), jnp.float32) if initial_state is None
          else initial_state.astype(jnp.float32))
    s, o = lax.scan(step, s0, (u, wk, attn, q_dec, k_dec, g_tot))
    o = jnp.swapaxes(jnp.moveaxis(o, 0, 1), 2, 3).reshape(b, n * c, hv, dv)[:, :t]
    return o.astype(out_dtype), s
