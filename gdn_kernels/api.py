"""The public API of docs/contract.md: validation first, then the implementation
switch. Jitted callables are cached per static configuration."""

from __future__ import annotations

import functools
import inspect

import jax

from . import reference, segments, validation
from .backends import BACKENDS
from .interpret import resolved_mode
from .delta_rule import DeltaRuleConfig, chunked_delta_rule
from .l2norm import DEFAULT_EPS
from .mixer import MixerConfig, gdn_mixer
from .state import GDNState, zero_recurrent, zero_state


def _segments(segment_ids):
    """segments.Segments of traced segment_ids, or None."""
    return None if segment_ids is None else segments.from_ids(segment_ids)


@functools.lru_cache(maxsize=None)
def jitted_delta_rule(cfg: DeltaRuleConfig):
    """jit of (q, k, v, g, beta, s0, ids) -> (o, final state)."""
    if BACKENDS[cfg.impl].module is None:
        return jax.jit(lambda q, k, v, g, beta, s0, ids: reference.token_scan(
            q, k, v, g, beta, cfg.scale, s0, segment_ids=ids))
    return jax.jit(lambda q, k, v, g, beta, s0, ids: chunked_delta_rule(
        cfg, q, k, v, g, beta, s0, _segments(ids)))


@functools.lru_cache(maxsize=None)
def jitted_mixer(cfg: MixerConfig):
    """jit of (x, w, a, b, a_log, dt_bias, ids, state) -> (o, GDNState)."""
    if BACKENDS[cfg.impl].module is None:
        return jax.jit(lambda x, w, a, b, a_log, dt_bias, ids, state: reference.reference_mixer(
            x, w, a, b, a_log, dt_bias, num_k_heads=cfg.num_k_heads,
            num_v_heads=cfg.num_v_heads, head_k_dim=cfg.head_k_dim,
            head_v_dim=cfg.head_v_dim, use_qk_norm=cfg.use_qk_norm, eps=cfg.eps,
            scale=cfg.scale, segment_ids=ids, state=state, return_state=True))
    return jax.jit(lambda x, w, a, b, a_log, dt_bias, ids, state: gdn_mixer(
        cfg, x, w, a, b, a_log, dt_bias, _segments(ids), state))


def _interpret_key(impl):
    """The GDN_INTERPRET mode read now, so a changed mode never reuses a trace."""
    return resolved_mode() if BACKENDS[impl].interprets else "n/a"


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     chunk_size=64, impl="pallas", segment_ids=None):
    """Chunked gated delta rule (docs/contract.md sections 1 and 6).

    q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None; segment_ids [B, T] int (0 =
    padding) or None. Returns (o [B, T, Hv, Dv] in v's dtype, final_state
    [B, Hv, Dk, Dv] float32).
    """
    cfg, initial_state = prepared_delta_rule(q, k, v, g, beta, scale, initial_state,
                                             chunk_size, impl, segment_ids)
    return jitted_delta_rule(cfg)(q, k, v, g, beta, initial_state, segment_ids)


def prepared_delta_rule(q, k, v, g, beta, scale, initial_state, chunk_size, impl,
                        segment_ids):
    """A gated_delta_rule call validated (ValueError/TypeError naming the
    argument), as (its static config, the initial state: zeros for None);
    the one preparation of the op and of its sharded version."""
    validation.validate_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                         chunk_size, impl, segment_ids=segment_ids)
    cfg = delta_rule_config(q, scale, chunk_size, impl)
    if initial_state is None:
        initial_state = zero_initial_state(q, v)
    return cfg, initial_state


def delta_rule_config(q, scale, chunk_size, impl) -> DeltaRuleConfig:
    """The static configuration of a validated gated_delta_rule call."""
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return DeltaRuleConfig(impl=impl, scale=scale, chunk_size=int(chunk_size),
                           interpret=_interpret_key(impl))


def zero_initial_state(q, v):
    """The initial state None stands for (state.zero_recurrent)."""
    return zero_recurrent(q.shape[0], v.shape[2], q.shape[3], v.shape[3], v.dtype)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads,
                         num_v_heads, head_k_dim, head_v_dim, use_qk_norm=True,
                         eps=DEFAULT_EPS, scale=None, chunk_size=64, impl="pallas",
                         segment_ids=None, state=None, return_state=False):
    """The GDN token mixer (docs/contract.md sections 2, 6 and 7), one custom VJP.

    x [B, T, 2*Hk*Dk + Hv*Dv]; conv_weight [K, C]; a, b [B, T, Hv];
    a_log, dt_bias [Hv], [B', Hv] or [B', T', Hv]; segment_ids [B, T] int
    (0 = padding) or None; state: the GDNState a previous call returned, or
    None (zeros). Returns o [B, T, Hv, Dv] in x's dtype, or (o, GDNState)
    with return_state=True. A call with T <= 4 (decode) runs token by token.
    """
    validated_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                    head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size, impl,
                    segment_ids, state, return_state)
    cfg = mixer_config(num_k_heads, num_v_heads, head_k_dim, head_v_dim, use_qk_norm, eps,
                       scale, chunk_size, impl)
    if state is not None:
        state = GDNState(*state)
    o, new_state = jitted_mixer(cfg)(x, conv_weight, a, b, a_log, dt_bias, segment_ids,
                                     state)
    return (o, new_state) if return_state else o


def validated_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads, num_v_heads,
                    head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size, impl,
                    segment_ids, state, return_state) -> None:
    """ValueError/TypeError naming the argument of a gdn_decoupled_conv1d call
    that breaks the contract: the one validation of the op and of its
    sharded version."""
    validation.validate_mixer(x, conv_weight, a, b, a_log, dt_bias, num_k_heads,
                              num_v_heads, head_k_dim, head_v_dim, use_qk_norm, eps,
                              scale, chunk_size, impl, segment_ids=segment_ids,
                              state=state, return_state=return_state)


def call_arguments(public, args, kwargs) -> dict:
    """The arguments of a call by name, as the public op `public` binds them
    (its defaults applied; TypeError for a call it would refuse)."""
    bound = inspect.signature(public).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def zero_mixer_state(x, conv_weight, num_v_heads, head_k_dim, head_v_dim) -> GDNState:
    """The GDNState None stands for (state.zero_state)."""
    return zero_state(x, conv_weight.shape[0], num_v_heads, head_k_dim, head_v_dim)


def mixer_config(num_k_heads, num_v_heads, head_k_dim, head_v_dim, use_qk_norm, eps, scale,
                 chunk_size, impl) -> MixerConfig:
    """The static configuration of a validated gdn_decoupled_conv1d call."""
    scale = float(head_k_dim ** -0.5 if scale is None else scale)
    return MixerConfig(impl=impl, num_k_heads=int(num_k_heads),
                       num_v_heads=int(num_v_heads), head_k_dim=int(head_k_dim),
                       head_v_dim=int(head_v_dim), use_qk_norm=bool(use_qk_norm),
                       eps=float(eps), scale=scale, chunk_size=int(chunk_size),
                       interpret=_interpret_key(impl))
