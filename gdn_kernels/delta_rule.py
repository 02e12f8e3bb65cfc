"""gated_delta_rule over a chunked backend, glued by one jax.custom_vjp."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax

from .backends import STATE_BYTES_PER_STEP, backend_for, kernel_settings
from .manual_axes import align_varying
from .segments import zero_padding_all


@dataclasses.dataclass(frozen=True)
class DeltaRuleConfig:
    """Static configuration of one gated_delta_rule call."""
    impl: str
    scale: float
    chunk_size: int
    interpret: str = "n/a"  # resolved GDN_INTERPRET mode (pallas): part of the jit cache key
    state_bytes_per_step: int = STATE_BYTES_PER_STEP   # pallas grid step budget


def _forward(cfg, q, k, v, g, beta, s0, seg):
    """Padding zeroed on the way in (identity steps) and on the way out."""
    q, k, v, g, beta = zero_padding_all(seg, q, k, v, g, beta)
    o, s_final, res = backend_for(cfg.impl, q.shape[1]).forward(q, k, v, g, beta, s0, cfg.scale,
                                                    kernel_settings(cfg), seg)
    (o,) = zero_padding_all(seg, o.astype(v.dtype))
    return (o, s_final), res


def chunked_delta_rule(cfg: DeltaRuleConfig, q, k, v, g, beta, s0, seg=None):
    """Returns (o [B, T, Hv, Dv] in v's dtype, final state, accumulation
    dtype). seg: segments.Segments of packed documents, or None. Under
    jax.shard_map the inputs first share one varying type (manual_axes)."""
    return _delta_rule_vjp(cfg, *align_varying(q, k, v, g, beta, s0), seg)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _delta_rule_vjp(cfg: DeltaRuleConfig, q, k, v, g, beta, s0, seg=None):
    return _forward(cfg, q, k, v, g, beta, s0, seg)[0]


def _fwd(cfg, q, k, v, g, beta, s0, seg=None):
    out, res = _forward(cfg, q, k, v, g, beta, s0, seg)
    return out, (q, k, v, g, beta, s0, seg, res)


def _bwd(cfg, saved, cotangents):
    q, k, v, g, beta, s0, seg, res = saved
    do, ds_final = cotangents
    primals = (q, k, v, g, beta)
    qz, kz, vz, gz, betaz, do = zero_padding_all(seg, *primals, do)
    *grads, ds0 = backend_for(cfg.impl, q.shape[1]).backward(qz, kz, vz, gz, betaz, res, do, ds_final,
                                                 cfg.scale, kernel_settings(cfg), seg)
    grads = zero_padding_all(seg, *grads)
    return tuple(d.astype(x.dtype) for d, x in zip(grads + (ds0,), primals + (s0,))) + (None,)


_delta_rule_vjp.defvjp(_fwd, _bwd)
