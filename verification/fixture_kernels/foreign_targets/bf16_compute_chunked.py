"""A foreign target that computes as kernels in the field do: a chunked WY
gated delta rule whose products run in the input dtype, so bfloat16 inputs
are computed in bfloat16 (operands in bfloat16, float32 accumulation, every
stored factor rounded to bfloat16) while the recurrent state stays float32.
It declares so (compute_precision="bfloat16"): the suite judges its
bfloat16 cases against the token scan under that rounding model, and lists
where it departs from the contract's float32 state as deviation rows.

Written independently of gdn_kernels' chunk math; the mixer's layer (conv,
QK norm, gates) reuses the float32 scan target's float32 helpers. Per
chunk of C tokens (T padded to a multiple of C with identity steps: g = 0,
beta = 0):
  D[i, j]   = exp(g_{j+1} + ... + g_i) for i >= j, else 0 (masked pairwise
              sums, never a difference of cumulative sums)
  A         = I + tril(beta_i k_i.k_j D[i, j], -1)           (rounded)
  [U | W]   = A^-1 [beta v | beta exp(G) k]   (forward substitution, rounded)
  new       = U - W S                                          (rounded)
  o         = scale (exp(G) q S + tril(q k^T D) new)
  S        <- exp(G_C) S + (D[C, :] k)^T new                  (float32)
Plain JAX autodiff (the backward rounds where the forward does). No packed
rows (segment_ids); chunk sizes 16..256 (256 beyond the contract): it
declares so.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from gdn_kernels import GDNState, validation
from verification.targets.declaration import KernelDeclaration, Supports

from .float32_only_scan import causal_conv_silu, gates, split_heads

F32 = jnp.float32
HIGHEST = lax.Precision.HIGHEST
# 256 beyond the contract's 16..128, as field kernels use (declared below).
CHUNK_SIZES = (16, 32, 64, 128, 256)


def _contract_chunk(chunk_size):
    """ValueError naming chunk_size unless it is one of CHUNK_SIZES; else
    the chunk size the contract's validation of the other arguments is
    given (its largest for 256)."""
    if isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    return min(chunk_size, 128)


def _dot(spec, a, b, cd):
    """einsum of a and b with operands in the compute dtype cd and float32
    accumulation (a float32 result)."""
    return jnp.einsum(spec, a.astype(cd), b.astype(cd), preferred_element_type=F32,
                      precision=HIGHEST)


def solve_unit_lower(strict, rhs):
    """X with (I + strict) X = rhs by forward substitution, one row per
    step. strict [..., C, C] strictly lower triangular; rhs [..., C, D].

    The default solve; solve_unit_lower_lapack is the same solve by
    jaxlib's batched LAPACK trsm (foreign_targets.lapack_solve_chunked)."""
    def row(x, i):
        xi = rhs[..., i, :] - jnp.einsum("...j,...jd->...d", strict[..., i, :], x,
                                         precision=HIGHEST)
        return x.at[..., i, :].set(xi), None

    x, _ = lax.scan(row, jnp.zeros_like(rhs), jnp.arange(rhs.shape[-2]))
    return x


def solve_unit_lower_lapack(strict, rhs):
    """solve_unit_lower by lax.linalg.triangular_solve on the whole batch
    (jaxlib's CPU LAPACK trsm, which splits its batch over XLA's intra-op
    thread pool; its derivative is a triangular solve as well)."""
    eye = jnp.eye(strict.shape[-1], dtype=strict.dtype)
    return lax.linalg.triangular_solve(strict + eye, rhs, left_side=True, lower=True,
                                       unit_diagonal=True)


# How chunked_delta_rule solves its chunk matrix, by name (a static argument).
SOLVES = {"substitution": solve_unit_lower, "lapack": solve_unit_lower_lapack}


def _pairwise_log_decay(g):
    """g [..., C] -> [..., C, C]: g_{j+1} + ... + g_i for i >= j (masked
    sums of g itself), -inf above the diagonal."""
    idx = jnp.arange(g.shape[-1])
    later = jnp.where(idx[:, None] > idx[None, :], g[..., :, None], 0.0)   # [m, j] = g_m, m > j
    return jnp.where(idx[:, None] >= idx[None, :], jnp.cumsum(later, axis=-2), -jnp.inf)


def _chunked(x, n, c):
    """[B, T, H, ...] -> [n, B, H, c, ...], T padded with zeros to n*c."""
    b, t, h = x.shape[:3]
    x = jnp.pad(x, [(0, 0), (0, n * c - t)] + [(0, 0)] * (x.ndim - 2))
    x = x.reshape((b, n, c, h) + x.shape[3:])
    return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)


def chunked_delta_rule(q, k, v, g, beta, s0, scale, chunk, state_dtype="float32",
                       solve="substitution"):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv] (all in the compute dtype);
    g, beta [B, T, Hv] float32; s0 [B, Hv, Dk, Dv] float32; state_dtype:
    the dtype the state is rounded to after every chunk when the compute
    dtype is below float32 (the variant foreign_targets.bf16_state_chunked
    keeps it in bfloat16); solve: a key of SOLVES. Returns
    (o [B, T, Hv, Dv] float32, final state float32)."""
    cd = v.dtype
    if cd == F32:                    # float32 inputs: the contract's float32 throughout
        state_dtype = F32
    b, t, hk, dk = q.shape
    hv, dv = v.shape[2:]
    n = -(-t // chunk)
    q, k = (jnp.repeat(x, hv // hk, axis=2) for x in (q, k))
    q, k, v, g, beta = (_chunked(x, n, chunk) for x in (q, k, v, g, beta))
    log_decay = _pairwise_log_decay(g)                           # [n, B, H, C, C]
    decay = jnp.exp(log_decay)
    g_cum = jnp.cumsum(g, axis=-1)                               # chunk start -> i
    strictly_lower = jnp.tril(jnp.ones((chunk, chunk), bool), -1)
    a = jnp.where(strictly_lower, beta[..., None] * _dot("...ik,...jk->...ij", k, k, cd)
                  * decay, 0.0).astype(cd)
    rhs = jnp.concatenate([beta[..., None] * v, (beta * jnp.exp(g_cum))[..., None] * k],
                          axis=-1).astype(cd)
    solved = SOLVES[solve](a.astype(F32), rhs.astype(F32)).astype(cd)
    u, w = solved[..., :dv], solved[..., dv:]
    attn = (_dot("...ik,...jk->...ij", q, k, cd) * decay).astype(cd)
    q_dec = (jnp.exp(g_cum)[..., None] * q).astype(cd)
    k_dec = (jnp.exp(log_decay[..., -1, :])[..., None] * k).astype(cd)
    g_total = g_cum[..., -1]

    def step(s, x):
        u, w, attn, q_dec, k_dec, g_total = x
        new = (u.astype(F32) - _dot("bhck,bhkv->bhcv", w, s, cd)).astype(cd)
        o = scale * (_dot("bhck,bhkv->bhcv", q_dec, s, cd)
                     + _dot("bhij,bhjv->bhiv", attn, new, cd))
        s = jnp.exp(g_total)[..., None, None] * s + _dot("bhck,bhcv->bhkv", k_dec, new, cd)
        return s.astype(state_dtype).astype(F32), o

    s, o = lax.scan(step, s0, (u, w, attn, q_dec, k_dec, g_total))
    o = jnp.swapaxes(jnp.moveaxis(o, 0, 1), 2, 3).reshape(b, n * chunk, hv, dv)[:, :t]
    return o, s


def _layer(x, conv_weight, a, b, a_log, dt_bias, hist0, static):
    """The mixer's float32 stages on history-then-x: silu(causal conv), the
    q/k/v split, the optional QK norm, the gates. Returns (q, k, v, g,
    beta, the last K-1 inputs)."""
    q, k, v = split_heads(causal_conv_silu(x, conv_weight, hist0), *static[:6])
    g, beta = gates(a, b, a_log, dt_bias)
    window = jnp.concatenate([hist0, x], axis=1)                # [B, K-1+T, C]
    return q, k, v, g, beta, window[:, window.shape[1] - (conv_weight.shape[0] - 1):]


@functools.lru_cache(maxsize=None)
def _delta_jit(scale, chunk, state_dtype, solve):
    def run(q, k, v, g, beta, s0):
        cd = v.dtype
        o, s = chunked_delta_rule(q.astype(cd), k.astype(cd), v, g.astype(F32),
                                  beta.astype(F32), s0.astype(F32), scale, chunk, state_dtype,
                                  solve)
        return o.astype(v.dtype), s
    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _mixer_jit(static, chunk, state_dtype, solve):
    scale = static[-1]

    def run(x, conv_weight, a, b, a_log, dt_bias, hist0, s0):
        cd = x.dtype
        q, k, v, g, beta, hist = _layer(*(t.astype(F32) for t in (x, conv_weight, a, b,
                                                                  a_log, dt_bias, hist0)),
                                        static)
        o, s = chunked_delta_rule(q.astype(cd), k.astype(cd), v.astype(cd), g, beta,
                                  s0.astype(F32), scale, chunk, state_dtype, solve)
        return o.astype(cd), GDNState(hist.astype(cd), s)
    return jax.jit(run)


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, chunk_size=64,
                     segment_ids=None, impl=None, state_dtype="float32",
                     solve="substitution"):
    validation.validate_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                         _contract_chunk(chunk_size), "reference",
                                         segment_ids=segment_ids)
    del impl
    if segment_ids is not None:
        raise ValueError("segment_ids: this kernel takes no packed rows")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    if initial_state is None:
        initial_state = jnp.zeros((q.shape[0], v.shape[2], q.shape[3], v.shape[3]), F32)
    return _delta_jit(scale, int(chunk_size), state_dtype, solve)(q, k, v, g, beta,
                                                                   initial_state)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                         head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                         segment_ids=None, chunk_size=64, impl=None, state=None,
                         return_state=False, state_dtype="float32",
                         solve="substitution"):
    validation.validate_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                              head_k_dim, head_v_dim, use_qk_norm, eps, scale,
                              _contract_chunk(chunk_size), "reference",
                              segment_ids=segment_ids, state=state,
                              return_state=return_state)
    del impl
    if segment_ids is not None:
        raise ValueError("segment_ids: this kernel takes no packed rows")
    scale = float(head_k_dim ** -0.5 if scale is None else scale)
    static = (int(num_k_heads), int(num_v_heads), int(head_k_dim), int(head_v_dim),
              bool(use_qk_norm), float(eps), scale)
    bsz, _, channels = x.shape
    if state is None:
        state = GDNState(jnp.zeros((bsz, conv_weight.shape[0] - 1, channels), x.dtype),
                         jnp.zeros((bsz, num_v_heads, head_k_dim, head_v_dim), F32))
    o, new_state = _mixer_jit(static, int(chunk_size), state_dtype, solve)(
        x, conv_weight, a, b, a_log, dt_bias, *state)
    return (o, new_state) if return_state else o


GDN_KERNEL = KernelDeclaration(
    gated_delta_rule=gated_delta_rule,
    gdn_decoupled_conv1d=gdn_decoupled_conv1d,
    supports=Supports(segment_ids=False, compute_precision="bfloat16", chunk_sizes=CHUNK_SIZES))
