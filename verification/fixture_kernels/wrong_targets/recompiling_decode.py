"""Wrong target: correct numbers, but every call builds its jitted program
anew (a fresh closure per call, as a decode loop that wraps each step in a
new jax.jit does), so a 256-step decode loop compiles 256 times."""

import jax

import gdn_kernels


def gated_delta_rule(*args, impl="xla", **kwargs):
    return gdn_kernels.gated_delta_rule(*args, impl=impl, **kwargs)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, impl="xla",
                         segment_ids=None, state=None, return_state=False, **static):
    def step(x, conv_weight, a, b, a_log, dt_bias, segment_ids, state):
        return gdn_kernels.gdn_decoupled_conv1d(
            x, conv_weight, a, b, a_log, dt_bias, impl=impl, segment_ids=segment_ids,
            state=state, return_state=return_state, **static)
    return jax.jit(step)(x, conv_weight, a, b, a_log, dt_bias, segment_ids, state)
