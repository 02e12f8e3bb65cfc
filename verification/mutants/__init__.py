"""The zoo of seeded kernel bugs (mutants) and how to materialise one.

A mutant is a small source patch against gdn_kernels/. Materialising it
copies the package to a temporary folder under the name gdn_mutant_<name>,
applies the patch and puts the folder on sys.path, so
`--gdn-target gdn_mutant_<name>:xla` (or :pallas) imports the broken copy
beside the untouched oracle. Every file of the package uses relative imports,
so the copy runs only its own (mutated) code.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from .catalog import MUTANTS, Mutant

PREFIX = "gdn_mutant_"
_ROOT = {"dir": None}


def _package_dir() -> str:
    import gdn_kernels
    return os.path.dirname(os.path.abspath(gdn_kernels.__file__))


def _root() -> str:
    if _ROOT["dir"] is None:
        _ROOT["dir"] = os.environ.get("GDN_MUTANT_DIR") or tempfile.mkdtemp(prefix="gdn-mutants-")
        if _ROOT["dir"] not in sys.path:
            sys.path.insert(0, _ROOT["dir"])
    return _ROOT["dir"]


def apply_patch(source: str, mutant: Mutant) -> str:
    """The mutated source; the original text must occur exactly `count` times."""
    found = source.count(mutant.old)
    if found != mutant.count:
        raise ValueError(f"mutant {mutant.name}: expected {mutant.count} occurrence(s) "
                         f"of its patch site in {mutant.file}, found {found}")
    return source.replace(mutant.old, mutant.new)


def materialize(name: str) -> str:
    """Create (once) the mutated package for mutant `name`; returns its module name."""
    mutant = MUTANTS[name]
    module_name = PREFIX + name
    target_dir = os.path.join(_root(), module_name)
    if not os.path.isdir(target_dir):
        shutil.copytree(_package_dir(), target_dir,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        path = os.path.join(target_dir, mutant.file)
        with open(path) as f:
            source = f.read()
        with open(path, "w") as f:
            f.write(apply_patch(source, mutant))
    return module_name


def ensure_importable(module_name: str) -> None:
    """Materialise gdn_mutant_<name> if a target names it."""
    if module_name.startswith(PREFIX):
        materialize(module_name[len(PREFIX):])
