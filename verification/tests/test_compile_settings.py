"""The suite's XLA:CPU compile settings (verification/engine/compile_settings.py):
when they apply, that they only add flags, and that programs compiled with
them compute what XLA's default build computes, within the tightest bound
of the tolerance policy."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from verification.engine import compile_settings as cs
from verification.tolerance import DTYPES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_installable_jax_is_the_one_the_settings_were_verified_on():
    """pyproject's jax / jaxlib ranges admit exactly the release series
    VERIFIED_JAXLIB names: a fresh install never resolves a jaxlib the
    settings were not checked on (it would run the suite without them)."""
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        text = f.read()
    for dep in ("jax", "jaxlib", "jax[tpu]"):
        low_major, low_minor, high_major, high_minor = map(int, re.search(
            rf'"{re.escape(dep)}>=(\d+)\.(\d+)\.\d+,<(\d+)\.(\d+)"', text).groups())
        assert low_major == high_major == 0, dep
        series = {f"0.{minor}." for minor in range(low_minor, high_minor)}
        assert series == set(cs.VERIFIED_JAXLIB), (dep, series)


def test_flags_are_added_once_and_keep_the_users_own():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4 "
                        "--xla_backend_optimization_level=2"}
    if cs.why_not_applied(env):
        pytest.skip(f"not applied here: {cs.why_not_applied(env)}")
    cs.apply(env)
    cs.apply(env)
    flags = env["XLA_FLAGS"].split()
    assert flags.count("--xla_cpu_use_fusion_emitters=false") == 1
    assert "--xla_force_host_platform_device_count=4" in flags
    # a flag the user set keeps the user's value
    assert [f for f in flags if f.startswith("--xla_backend_optimization_level")] == [
        "--xla_backend_optimization_level=2"]


@pytest.mark.parametrize("env, reason", [
    ({cs.OPT_OUT_ENV: "1"}, cs.OPT_OUT_ENV),
    ({"JAX_PLATFORMS": "tpu"}, "JAX_PLATFORMS"),
])
def test_opt_out_and_accelerators_keep_xla_defaults(env, reason):
    before = dict(env)
    assert reason in cs.apply(env)
    assert env == before


_PROGRAM = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from gdn_kernels import gdn_decoupled_conv1d
impl = sys.argv[1]
jax.config.update("jax_enable_x64", impl == "reference")
dt = jnp.float64 if impl == "reference" else jnp.float32
B, T, Hk, Hv, D = 2, 101, 1, 2, 16
C = 2 * Hk * D + Hv * D
r = np.random.default_rng(0)
x = jnp.asarray(r.standard_normal((B, T, C)), dt)
w = jnp.asarray(r.standard_normal((4, C)) / 2, dt)
a = jnp.asarray(r.standard_normal((B, T, Hv)), dt)
b = jnp.asarray(r.standard_normal((B, T, Hv)), dt)
p = jnp.zeros((Hv,), dt)
co = jnp.asarray(r.standard_normal((B, T, Hv, D)), dt)
def loss(*args):
    o = gdn_decoupled_conv1d(*args, num_k_heads=Hk, num_v_heads=Hv, head_k_dim=D,
                             head_v_dim=D, chunk_size=32, impl=impl)
    return (o * co).sum()
g = jax.jit(jax.grad(loss, argnums=tuple(range(6))))(x, w, a, b, p, p)
print(json.dumps([np.asarray(t, np.float64).ravel().tolist() for t in g]))
"""
_GRADIENTS = {}


def _gradients(impl: str, defaults: bool):
    """The mixer's six gradients at one lattice-sized case, computed in a
    fresh process with XLA's defaults or with the suite's settings."""
    key = (impl, defaults)
    if key not in _GRADIENTS:
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if defaults:
            env[cs.OPT_OUT_ENV] = "1"
        else:
            env.pop(cs.OPT_OUT_ENV, None)
            cs.apply(env)
        out = subprocess.run([sys.executable, "-c", _PROGRAM, impl], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=600, check=True)
        _GRADIENTS[key] = [np.asarray(t) for t in json.loads(out.stdout)]
    return _GRADIENTS[key]


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_fast_compiles_are_as_accurate_as_the_default_build(impl):
    """Both builds of the float32 kernels against the float64 oracle, and
    against each other: every gradient within half the policy's float32
    floor (measured: 2e-7..5e-7 fast, 6e-8..2.6e-7 default, 1.5e-7..6e-7
    apart: float32 rounding in another order, nothing more)."""
    if cs.why_not_applied({}):
        pytest.skip(f"not applied here: {cs.why_not_applied({})}")
    half_floor = DTYPES["float32"].rel_floor / 2
    oracle = _gradients("reference", True)
    fast, default = _gradients(impl, False), _gradients(impl, True)
    for i, (f, d, o) in enumerate(zip(fast, default, oracle)):
        errors = {"fast vs oracle": _rel(f, o), "default vs oracle": _rel(d, o),
                  "fast vs default": _rel(f, d)}
        assert max(errors.values()) < half_floor, (i, errors)
