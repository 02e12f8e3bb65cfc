"""gdn-verify under a name of its own.

The suite's packages keep their short names (gdn_kernels, strategies,
verification, benchmarks), which a kernel author's project may use for its
own packages. What pytest loads at start-up is this package's entry module
(gdn_verify.pytest_plugin), which imports nothing of the suite until a
target is named; then `load_suite()` binds the suite's packages to this
installation, even where the project's own packages of those names come
first on sys.path, and the suite's subprocesses start through
`python -m gdn_verify.run MODULE`, which does the same.

The public API is reachable here too (`from gdn_verify import adapt,
adapt_mixer, mixer_from_core, from_torch, from_mlx, KernelDeclaration,
Supports, Limits`), the documented alias of `from verification import ...` for a
project with its own `verification`.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import List

# The suite's top-level packages, bound to this installation by load_suite().
SUITE_PACKAGES = ("gdn_kernels", "strategies", "verification", "benchmarks")
PUBLIC_API = ("adapt", "adapt_mixer", "mixer_from_core", "from_torch", "from_mlx",
              "KernelDeclaration", "Supports", "Limits")


class SuiteShadowed(ImportError):
    """A package of the suite's name was imported from elsewhere before the
    suite could load: the message names it, where it came from, and what to do."""


def suite_root() -> str:
    """The directory holding the suite's packages (site-packages, or the
    checkout of an editable install)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inside(module, root: str) -> bool:
    path = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", [])), "")
    return os.path.abspath(path).startswith(os.path.join(root, ""))


def shadowed() -> List[str]:
    """The suite's package names already imported from another place."""
    root = suite_root()
    return [name for name in SUITE_PACKAGES
            if name in sys.modules and not _inside(sys.modules[name], root)]


def load_suite() -> None:
    """Import the suite's packages from suite_root(), ahead of whatever else
    sys.path holds under their names (their submodules then follow from
    them). SuiteShadowed if another package of one of those names was
    imported already in this process."""
    clash = shadowed()
    if clash:
        where = ", ".join(f"{n} ({getattr(sys.modules[n], '__file__', None) or 'a namespace'})"
                          for n in clash)
        raise SuiteShadowed(
            f"gdn-verify: your project's own package(s) {where} were imported before "
            f"gdn-verify could load its packages of the same name(s) from {suite_root()}: "
            f"do not import them from a conftest.py or a pytest plugin of a session that "
            f"runs the suite (--gdn-target), or run `gdn-verify --target ...` instead")
    root = suite_root()
    sys.path.insert(0, root)
    try:
        for name in SUITE_PACKAGES:
            importlib.import_module(name)
    finally:
        sys.path.remove(root)


def __getattr__(name: str):
    if name in PUBLIC_API:
        load_suite()
        return getattr(importlib.import_module("verification"), name)
    raise AttributeError(f"module 'gdn_verify' has no attribute {name!r}")
