"""The suite's tests: test_properties.py (one test per registered property,
generated; the file the pytest plugin runs on a target) and the meta-tests
that hold the suite, the kernels and the docs to their word."""

import importlib
import importlib.util
import os

import pytest

# The tests of the bridges and their fixtures need the framework (the
# [torch] and [mlx] extras): skipped without it, unless GDN_REQUIRE_TORCH /
# GDN_REQUIRE_MLX is set (.ci/run sets both, so the gate cannot pass by
# skipping them).
REQUIRE_TORCH_ENV, REQUIRE_MLX_ENV = "GDN_REQUIRE_TORCH", "GDN_REQUIRE_MLX"


def _reason(module: str, extra: str) -> str:
    return f"{module.split('.')[0]} not installed (the [{extra}] extra)"


def _without(module: str, require_env: str, extra: str):
    """A skip mark for a test that needs module, unless require_env is set."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None and not os.environ.get(require_env),
        reason=_reason(module, extra))


def framework(module: str, require_env: str, extra: str):
    """module, imported for a test module that needs it throughout: the
    whole module is skipped without it, as WITHOUT_* skips a test, except
    where require_env is set (then a missing framework is an error)."""
    if os.environ.get(require_env):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=_reason(module, extra))


WITHOUT_TORCH = _without("torch", REQUIRE_TORCH_ENV, "torch")
WITHOUT_MLX = _without("mlx", REQUIRE_MLX_ENV, "mlx")
