"""The MLX bridge (verification/targets/mlx_bridge.py): dtypes cross
exactly, the gradients are MLX's own (a custom_function's vjp is what is
judged), the MLX token scan agrees with the float64 oracle, and its planted
bug is killed with a counterexample that replays. Its no-false-alarm run is
in test_foreign_targets.py; what the bridge shares with torch's
(verification/targets/bridge.py: 64-bit values from a whole program,
compile counts not checkable) is tested in test_torch_bridge.py.

Needs MLX (the [mlx] extra): skipped without it, except where
GDN_REQUIRE_MLX is set (.ci/run sets it)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from . import REQUIRE_MLX_ENV, framework

mx = framework("mlx.core", REQUIRE_MLX_ENV, "mlx")

from gdn_kernels.reference import token_scan as oracle_token_scan

from ..engine.registry import PROPERTIES
from ..properties import load_all
from ..targets import Target
from ..targets.mlx_bridge import from_mlx
from .bridges import DTYPES, check_dtypes_cross_exactly, product_and_difference

load_all()

SCAN = "verification.fixture_kernels.mlx_targets.token_scan"
SCAN_BUG = "verification.fixture_kernels.mlx_targets.token_scan_decay_after_update"
SCAN_BUG_COMPILED = "verification.fixture_kernels.mlx_targets.compiled_decay_after_update"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_dtypes_cross_exactly_forward_and_back(dtype):
    """Elementwise products computed in MLX equal JAX's bit for bit in each
    dtype, under jit, and the gradients come back in the inputs' dtypes
    (bridges.check_dtypes_cross_exactly)."""
    check_dtypes_cross_exactly(from_mlx, dtype)


@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_the_gradient_is_the_kernels_own_vjp(factor):
    """y = 2x with a custom vjp of `factor`: the bridged gradient is what the
    kernel's vjp says, right (2) or wrong (3)."""
    @mx.custom_function
    def double(x):
        return 2.0 * x

    @double.vjp
    def double_vjp(primals, cotangent, output):
        return factor * cotangent

    x = jnp.arange(4.0, dtype=jnp.float32)
    y, pullback = jax.vjp(from_mlx(double), x)
    np.testing.assert_array_equal(np.asarray(y), 2.0 * np.asarray(x))
    (dx,) = pullback(jnp.ones_like(y))
    np.testing.assert_array_equal(np.asarray(dx), np.full(4, factor, np.float32))


def test_device_and_callable_are_checked():
    with pytest.raises(ValueError, match="device"):
        from_mlx(product_and_difference, device="tpu")
    with pytest.raises(TypeError, match="callable"):
        from_mlx(42)


# MLX 0.32's CPU float64 exp is accurate to float32 only (8.8e-8 absolute on
# N(0, 1) inputs, where its float64 matmul is exact to 4e-16): the scan's
# decay factors, so its float64 cases carry float32-sized errors. The
# suite's float64 probe (vjp_matches_finite_differences) then judges it in
# float32, as for a kernel computing in float32.
MLX_FLOAT64_REL = 2e-7


@pytest.mark.parametrize("dtype, rel", [("float64", MLX_FLOAT64_REL), ("float32", 2e-5)])
def test_mlx_token_scan_matches_the_float64_oracle(dtype, rel):
    """The MLX fixture, through from_mlx and adapt, against the float64
    token-by-token oracle: outputs and every input cotangent (its final
    state comes back in float32, the adapter's cast), float64 inputs
    computed in float64 but for MLX's exp (MLX_FLOAT64_REL)."""
    target = Target.parse(SCAN)
    rng = np.random.default_rng(1)
    b, t, hk, hv, dk, dv = 2, 13, 1, 2, 8, 4
    with jax.enable_x64(True):
        k = rng.standard_normal((b, t, hk, dk))
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        arrays = [jnp.asarray(a, DTYPES[dtype]) for a in (
            rng.standard_normal((b, t, hk, dk)) / 3, k, rng.standard_normal((b, t, hv, dv)),
            -0.3 * np.abs(rng.standard_normal((b, t, hv))),
            1 / (1 + np.exp(-rng.standard_normal((b, t, hv)))),
            rng.standard_normal((b, hv, dk, dv)))]
        cts = (jnp.asarray(rng.standard_normal((b, t, hv, dv)), DTYPES[dtype]),
               jnp.asarray(rng.standard_normal((b, hv, dk, dv)), jnp.float32))
        out, pullback = jax.vjp(lambda *a: target.gated_delta_rule(*a[:5], initial_state=a[5]),
                                *arrays)
        grads = pullback(cts)
        wide = [a.astype(jnp.float64) for a in arrays]
        ref_out, ref_pullback = jax.vjp(
            lambda *a: oracle_token_scan(*a[:5], dk ** -0.5, initial_state=a[5]), *wide)
        ref_grads = ref_pullback(tuple(c.astype(jnp.float64) for c in cts))

    def rel_err(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return np.linalg.norm(a - b) / np.linalg.norm(b)
    assert out[0].dtype == arrays[2].dtype and rel_err(out[0], ref_out[0]) <= rel
    assert rel_err(out[1], ref_out[1]) <= 2e-7
    for got, want in zip(grads, ref_grads):
        assert got.dtype == arrays[2].dtype and rel_err(got, want) <= rel


def test_compile_counts_are_not_checkable_on_an_mlx_target():
    target = Target.parse(SCAN)
    assert "from_mlx" in PROPERTIES["decode_compiles_once"].not_checkable(target)
    assert any(line.startswith("mlx kernel through from_mlx")
               for line in target.declaration.conventions)


@pytest.mark.parametrize("bug", [SCAN_BUG, SCAN_BUG_COMPILED])
def test_a_planted_bug_in_an_mlx_kernel_is_killed_and_replays(bug, tmp_path):
    """From a directory outside the repository: the decay applied after the
    update (its step plain, or compiled by mx.compile) fails the forward
    parity with a counterexample file, and `gdn-verify replay` reproduces
    it; each process's status is the verdict's, 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDN_")}
    run = [sys.executable, "-m", "verification.cli"]
    proc = subprocess.run(
        run + ["--target", bug, "--profile", "dev", "--examples", "2",
               "--properties", "delta_rule_forward_parity", "--jobs", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    files = glob.glob(str(tmp_path / "counterexamples" / "delta_rule_forward_parity-*.json"))
    assert files, proc.stdout[-3000:]
    replay = subprocess.run(run + ["replay", files[0]], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path, env=env)
    assert replay.returncode == 1 and "STILL FAILS" in replay.stdout, replay.stdout[-2000:]
