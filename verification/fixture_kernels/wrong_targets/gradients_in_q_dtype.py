"""Wrong target: a correct float32 token scan (the foreign float32_compute_scan)
behind a custom VJP that returns every cotangent in q's dtype, adapted with
verification.adapt. The values are right; the initial state's cotangent of
a bfloat16 call comes back in bfloat16 (the contract: its primal's float32).
The adapter casts it, so every value property holds; the convention
property must report the deviation."""

import functools

import jax

from verification import adapt
from verification.fixture_kernels.foreign_targets.float32_compute_scan import gated_delta_rule as _scan


def _delta_rule(q, k, v, g, beta, initial_state, scale):
    return _scan(q, k, v, g, beta, scale=scale, initial_state=initial_state)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _kernel(q, k, v, g, beta, initial_state, scale):
    return _delta_rule(q, k, v, g, beta, initial_state, scale)


def _fwd(q, k, v, g, beta, initial_state, scale):
    return jax.vjp(lambda *a: _delta_rule(*a, scale), q, k, v, g, beta, initial_state)


def _bwd(scale, pullback, cts):
    dq, *rest = pullback(cts)
    return (dq,) + tuple(d.astype(dq.dtype) for d in rest)


_kernel.defvjp(_fwd, _bwd)


def gradients_in_q_dtype(q, k, v, g, beta, *, scale, initial_state):
    return _kernel(q, k, v, g, beta, initial_state, scale)


GDN_KERNEL = adapt(gradients_in_q_dtype, varlen=None, chunk_size=None)
