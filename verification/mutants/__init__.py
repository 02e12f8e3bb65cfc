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


def mutant_root() -> str:
    """The folder mutants are materialised in (GDN_MUTANT_DIR, else a temporary
    one made once per process), on sys.path."""
    return _root()


def _root() -> str:
    if _ROOT["dir"] is None:
        _ROOT["dir"] = os.environ.get("GDN_MUTANT_DIR") or tempfile.mkdtemp(prefix="gdn-mutants-")
        if _ROOT["dir"] not in sys.path:
            sys.path.insert(0, _ROOT["dir"])
    return _ROOT["dir"]


class PatchError(ValueError):
    """A mutant's patch no longer applies (its kernel line was renamed or
    moved): the mutation run fails loudly, naming the mutant."""


def apply_patch(source: str, mutant: Mutant) -> str:
    """The mutated source. The patch site must occur exactly `count` times
    and the patch must change code, not only comments (PatchError)."""
    found = source.count(mutant.old)
    if found != mutant.count:
        raise PatchError(f"mutant {mutant.name}: expected {mutant.count} occurrence(s) "
                         f"of its patch site in gdn_kernels/{mutant.file}, found {found} "
                         f"(was the kernel line renamed or moved? update "
                         f"verification/mutants/catalog.py)")
    mutated = source.replace(mutant.old, mutant.new)
    if _code_tokens(mutated) == _code_tokens(source):
        raise PatchError(f"mutant {mutant.name}: its patch changes only comments or "
                         f"whitespace in gdn_kernels/{mutant.file}")
    return mutated


def _code_tokens(source: str):
    """The source's tokens without comments and layout (what Python runs)."""
    import io
    import tokenize
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
            tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in skip]


def changed_functions(source: str, mutated: str, filename: str):
    """Qualified names of the functions (code objects) whose compiled
    bytecode, constants or names differ between source and mutated."""
    def code_objects(text):
        found = {}

        def walk(code, prefix):
            name = f"{prefix}.{code.co_name}" if prefix else code.co_name
            consts = tuple(c for c in code.co_consts if not hasattr(c, "co_code"))
            found[name] = (code.co_code, repr(consts), code.co_names)
            for c in code.co_consts:
                if hasattr(c, "co_code"):
                    walk(c, name)

        walk(compile(text, filename, "exec"), "")
        return found

    before, after = code_objects(source), code_objects(mutated)
    return sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))


def mutated_source(name: str) -> tuple:
    """(original, mutated) source of the file mutant `name` patches."""
    mutant = MUTANTS[name]
    with open(os.path.join(_package_dir(), mutant.file)) as f:
        source = f.read()
    return source, apply_patch(source, mutant)


def materialize(name: str) -> str:
    """Create (once) the mutated package for mutant `name`; returns its
    module name. The copy is built under a temporary name and renamed into
    place, so processes materialising the same mutant at once never see a
    half-written package (the first rename wins; the others drop theirs)."""
    mutant = MUTANTS[name]
    module_name = PREFIX + name
    target_dir = os.path.join(_root(), module_name)
    if not os.path.isdir(target_dir):
        _, mutated = mutated_source(name)      # PatchError before any copy
        scratch = tempfile.mkdtemp(prefix=f".{module_name}-", dir=_root())
        building = os.path.join(scratch, module_name)
        shutil.copytree(_package_dir(), building,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        with open(os.path.join(building, mutant.file), "w") as f:
            f.write(mutated)
        try:
            os.rename(building, target_dir)
        except OSError:
            if not os.path.isdir(target_dir):
                raise
        shutil.rmtree(scratch, ignore_errors=True)
    return module_name


def ensure_importable(module_name: str) -> None:
    """Materialise gdn_mutant_<name> if a target names it."""
    if module_name.startswith(PREFIX):
        materialize(module_name[len(PREFIX):])
