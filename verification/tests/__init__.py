"""The suite's tests: test_properties.py (one test per registered property,
generated; the file the pytest plugin runs on a target) and the meta-tests
that hold the suite, the kernels and the docs to their word."""

import importlib.util
import os

import pytest

# The tests of the torch bridge and its fixtures need torch (the [torch]
# extra): skipped without it, unless GDN_REQUIRE_TORCH is set (.ci/run sets
# it, so the gate cannot pass by skipping them).
REQUIRE_TORCH_ENV = "GDN_REQUIRE_TORCH"
WITHOUT_TORCH = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None and not os.environ.get(REQUIRE_TORCH_ENV),
    reason="torch not installed (the [torch] extra)")
