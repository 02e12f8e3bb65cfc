"""The suite's tests: test_properties.py (one test per registered property,
generated; the file the pytest plugin runs on a target) and the meta-tests
that hold the suite, the kernels and the docs to their word."""

import importlib.util
import os

import pytest

# The tests of the bridges and their fixtures need the framework (the
# [torch] and [mlx] extras): skipped without it, unless GDN_REQUIRE_TORCH /
# GDN_REQUIRE_MLX is set (.ci/run sets both, so the gate cannot pass by
# skipping them).
REQUIRE_TORCH_ENV, REQUIRE_MLX_ENV = "GDN_REQUIRE_TORCH", "GDN_REQUIRE_MLX"


def _without(module: str, require_env: str, extra: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None and not os.environ.get(require_env),
        reason=f"{module} not installed (the [{extra}] extra)")


WITHOUT_TORCH = _without("torch", REQUIRE_TORCH_ENV, "torch")
WITHOUT_MLX = _without("mlx", REQUIRE_MLX_ENV, "mlx")
