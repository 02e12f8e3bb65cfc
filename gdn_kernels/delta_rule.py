"""gated_delta_rule over a chunked backend, glued by one jax.custom_vjp."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax

from .backends import get_backend


@dataclasses.dataclass(frozen=True)
class DeltaRuleConfig:
    """Static configuration of one gated_delta_rule call."""
    impl: str
    scale: float
    chunk_size: int
    interpret: str = "n/a"  # resolved GDN_INTERPRET mode (pallas): part of the jit cache key


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def chunked_delta_rule(cfg: DeltaRuleConfig, q, k, v, g, beta, s0):
    """Returns (o [B, T, Hv, Dv] in v's dtype, final state, accumulation dtype)."""
    o, s_final, _ = get_backend(cfg.impl).forward(q, k, v, g, beta, s0,
                                                  cfg.scale, cfg.chunk_size)
    return o.astype(v.dtype), s_final


def _fwd(cfg, q, k, v, g, beta, s0):
    o, s_final, res = get_backend(cfg.impl).forward(q, k, v, g, beta, s0,
                                                    cfg.scale, cfg.chunk_size)
    return (o.astype(v.dtype), s_final), (q, k, v, g, beta, s0, res)


def _bwd(cfg, saved, cotangents):
    q, k, v, g, beta, s0, res = saved
    do, ds_final = cotangents
    grads = get_backend(cfg.impl).backward(q, k, v, g, beta, res, do, ds_final,
                                           cfg.scale, cfg.chunk_size)
    return tuple(d.astype(x.dtype) for d, x in zip(grads, (q, k, v, g, beta, s0)))


chunked_delta_rule.defvjp(_fwd, _bwd)
