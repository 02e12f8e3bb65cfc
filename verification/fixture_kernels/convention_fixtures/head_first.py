"""A kernel author's gated delta rule in head-first conventions.

Conventions (different from the contract's):
  * head-first tensors: q, k [B, H, T, Dk], v [B, H, T, Dv]; equal head
    counts for q/k and v (no grouped value heads);
  * `decay` [B, H, T] is the decay FACTOR alpha = exp(g) in [0, 1], not its
    log; the state is multiplied by alpha (no log is ever taken);
  * beta [B, H, T] is a probability;
  * the scale is fixed at Dk**-0.5 (no scale argument);
  * the state is stored transposed, [B, H, Dv, Dk].
Float32 token-by-token lax.scan, plain JAX autodiff.
"""

import jax.numpy as jnp
from jax import lax

# The decay applied after the write instead of before it.
# (The pattern is split in two literals so that it occurs once in this file.)
PLANTED_BUG = ("s = _write(a_t[..., None, None] * s, " "k_t, v_t, b_t)",
               "s = a_t[..., None, None] * _write(s, k_t, v_t, b_t)")

HI = "highest"


def _write(s, k_t, v_t, b_t):
    """Delta-rule write into a transposed state.
    s [B, H, Dv, Dk]; k_t [B, H, Dk]; v_t [B, H, Dv]; b_t [B, H]."""
    err = v_t - jnp.einsum("bhvk,bhk->bhv", s, k_t, precision=HI)
    return s + jnp.einsum("bhv,bhk->bhvk", b_t[..., None] * err, k_t, precision=HI)


def delta_rule_head_first(q, k, v, decay, beta, initial_state=None):
    """q, k [B, H, T, Dk]; v [B, H, T, Dv]; decay (alpha), beta [B, H, T];
    initial_state [B, H, Dv, Dk] or None (zeros).
    Returns (o [B, H, T, Dv] in v's dtype, final_state [B, H, Dv, Dk] float32)."""
    b, h, _, dk = q.shape
    dv = v.shape[-1]
    scale = dk ** -0.5
    if initial_state is None:
        s0 = jnp.zeros((b, h, dv, dk), jnp.float32)
    else:
        s0 = initial_state.astype(jnp.float32)
    xs = tuple(jnp.moveaxis(x.astype(jnp.float32), 2, 0) for x in (q, k, v, decay, beta))

    def step(s, x):
        q_t, k_t, v_t, a_t, b_t = x
        s = _write(a_t[..., None, None] * s, k_t, v_t, b_t)
        return s, scale * jnp.einsum("bhvk,bhk->bhv", s, q_t, precision=HI)

    s, o = lax.scan(step, s0, xs)
    return jnp.moveaxis(o, 0, 2).astype(v.dtype), s
