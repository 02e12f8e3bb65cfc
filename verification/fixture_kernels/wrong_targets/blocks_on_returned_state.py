"""Wrong target: a mixer call that returns its state never returns: its
output passes through a host callback waiting on an event nothing sets
(as a kernel waiting on a device or a collective that never answers
would), in the forward and so in every VJP program. Every other call is
gdn_kernels' token scan (impl="reference"), which holds. The watchdog
(verification/engine/watchdog.py) ends such an example as failure class
hung: verification/tests/test_watchdog.py."""

import threading

import jax
import numpy as np

import gdn_kernels

_NEVER = threading.Event()


def _wait_forever(x):
    _NEVER.wait()
    return np.asarray(x)


@jax.custom_vjp
def _blocked(x):
    """x, once an event that is never set is set."""
    return jax.pure_callback(_wait_forever, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


_blocked.defvjp(lambda x: (_blocked(x), None), lambda _, ct: (ct,))


def gated_delta_rule(*args, impl="reference", **kwargs):
    return gdn_kernels.gated_delta_rule(*args, impl=impl, **kwargs)


def gdn_decoupled_conv1d(*args, impl="reference", return_state=False, **kwargs):
    out = gdn_kernels.gdn_decoupled_conv1d(*args, impl=impl, return_state=return_state,
                                           **kwargs)
    if not return_state:
        return out
    o, state = out
    return _blocked(o), state
