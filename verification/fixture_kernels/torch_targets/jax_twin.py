"""token_scan's math in JAX, in the same conventions, through the same
adapters: the baseline of the torch bridge's overhead benchmark
(benchmarks/bridge.py). The same recurrence step by step (lax.scan),
float32 (float64 for float64 inputs), plain JAX autodiff."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from verification import adapt, mixer_from_core


def token_scan(q, k, v, g, beta, *, scale=None, initial_state=None):
    """(o [B, T, H, Dv], final state [B, H, Dk, Dv]), as token_scan.token_scan."""
    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    b, _, h, dk = q.shape
    dv, out_dtype = v.shape[-1], v.dtype
    scale = dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.astype(acc) for x in (q, k, v, g, beta))
    state = (jnp.zeros((b, h, dk, dv), acc) if initial_state is None
             else initial_state.astype(acc))

    def step(s, xs):
        q_t, k_t, v_t, g_t, beta_t = xs
        s = s * jnp.exp(g_t)[..., None, None]
        predicted = jnp.einsum("bhk,bhkv->bhv", k_t, s)
        s = s + jnp.einsum("bhk,bhv->bhkv", k_t, beta_t[..., None] * (v_t - predicted))
        return s, jnp.einsum("bhk,bhkv->bhv", q_t * scale, s)

    time_first = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
    state, o = jax.lax.scan(step, state, time_first)
    return jnp.moveaxis(o, 0, 1).astype(out_dtype), state


GDN_KERNEL = mixer_from_core(adapt(token_scan, heads="equal", varlen=None, chunk_size=None))
