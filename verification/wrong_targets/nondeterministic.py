"""Wrong target: adds run-to-run noise (as unordered atomics would) through a
host callback, so two identical calls differ in the last bits. It wraps
the float32 token scan (impl="reference" unless the spec names an impl): a
program with a host callback is never served from the compile cache, and
the scan compiles in a third of the chunked kernels' time."""

import jax
import numpy as np

import gdn_kernels

_rng = np.random.default_rng()


def _jitter(x):
    def host(v):
        v = np.asarray(v)
        return (v + _rng.standard_normal(v.shape).astype(v.dtype) * np.asarray(1e-7, v.dtype)).astype(v.dtype)
    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def gated_delta_rule(*args, impl="reference", **kwargs):
    o, s = gdn_kernels.gated_delta_rule(*args, impl=impl, **kwargs)
    return _jitter(o), s


def gdn_decoupled_conv1d(*args, impl="reference", **kwargs):
    return _jitter(gdn_kernels.gdn_decoupled_conv1d(*args, impl=impl, **kwargs))
