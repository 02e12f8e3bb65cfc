"""Wrong target: its result depends on how many calls came before (as the
scheduling of unordered atomics would make it): call n adds one unit in
the last place to element n mod size of the output, so two calls on the
same inputs never agree bit for bit, yet agree far within every tolerance
(one ulp: 6e-8 relative in float32, 4e-3 in bfloat16).

The change is exact and the same on every machine, so every property's
verdict on this target is decided by the case alone (determinism fails,
tolerance-based properties pass), and shrinking follows the same path in
a serial, a parallel and a sharded run (verification/tests/test_parallel.py
compares their example counts). Random noise would not do: rounded to
bfloat16 it often vanishes, which made the shrink path, and so the example
count, differ from run to run.

It wraps the float32 token scan (impl="reference" unless the spec names an
impl): a program with a host callback is never served from the compile
cache, and the scan compiles in a third of the chunked kernels' time."""

import itertools

import jax
import numpy as np

import gdn_kernels

_CALLS = itertools.count()


def _last_place_changed(v):
    """v with one unit in the last place added to element n mod size (n:
    this call's number): the bits read as an unsigned integer, plus one."""
    v = np.array(v)
    n = next(_CALLS)
    if v.size:
        bits = v.reshape(-1).view(np.dtype(f"u{v.dtype.itemsize}"))
        bits[n % v.size] += 1
    return v


def _jitter(x):
    return jax.pure_callback(_last_place_changed, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def gated_delta_rule(*args, impl="reference", **kwargs):
    o, s = gdn_kernels.gated_delta_rule(*args, impl=impl, **kwargs)
    return _jitter(o), s


def gdn_decoupled_conv1d(*args, impl="reference", **kwargs):
    return _jitter(gdn_kernels.gdn_decoupled_conv1d(*args, impl=impl, **kwargs))
