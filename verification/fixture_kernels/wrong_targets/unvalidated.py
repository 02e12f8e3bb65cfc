"""Wrong target: the real kernels with input validation skipped, so bad input
crashes somewhere inside (or silently broadcasts) instead of raising a clear
error that names the argument."""

from gdn_kernels.delta_rule import DeltaRuleConfig, chunked_delta_rule
from gdn_kernels.interpret import resolved_mode
from gdn_kernels.mixer import MixerConfig, gdn_mixer


def _mode(impl):
    return resolved_mode() if impl == "pallas" else "n/a"


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     chunk_size=64, impl="xla"):
    import jax.numpy as jnp
    if initial_state is None:
        initial_state = jnp.zeros((q.shape[0], v.shape[2], q.shape[3], v.shape[3]), jnp.float32)
    cfg = DeltaRuleConfig(impl=impl, scale=float(scale or q.shape[-1] ** -0.5),
                          chunk_size=int(chunk_size), interpret=_mode(impl))
    return chunked_delta_rule(cfg, q, k, v, g, beta, initial_state)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                         head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                         chunk_size=64, impl="xla"):
    cfg = MixerConfig(impl=impl, num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                      head_k_dim=head_k_dim, head_v_dim=head_v_dim, use_qk_norm=use_qk_norm,
                      eps=eps, scale=float(scale or head_k_dim ** -0.5), chunk_size=int(chunk_size),
                      interpret=_mode(impl))
    return gdn_mixer(cfg, x, conv_weight, a, b, a_log, dt_bias)[0]   # (o, GDNState)
