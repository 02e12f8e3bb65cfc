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
    """A mutant's patch no longer applies (its function was renamed or
    moved, or the line inside it changed): the mutation run fails loudly,
    naming the mutant and the function."""


def function_spans(source: str) -> dict:
    """Qualified name ("f", "f.inner", "Class.method") -> (start, end)
    character offsets of each function or class definition in source."""
    import ast
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                spans[name] = (starts[child.lineno - 1], starts[child.end_lineno])
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return spans


def apply_patch(source: str, mutant: Mutant) -> str:
    """The mutated source: `old` replaced by `new` inside the mutant's
    function(s), where it must occur exactly `count` times; the patch must
    change code, not only comments (PatchError naming the function)."""
    spans = function_spans(source)
    where = f"gdn_kernels/{mutant.file}"
    missing = [f for f in mutant.functions if f not in spans]
    if missing or not mutant.functions:
        raise PatchError(f"mutant {mutant.name}: function {missing or '(none named)'} not "
                         f"found in {where} (renamed or moved? update its `function` in "
                         f"verification/mutants/catalog.py)")
    ranges = sorted(spans[f] for f in mutant.functions)
    found = sum(source[a:b].count(mutant.old) for a, b in ranges)
    if found != mutant.count:
        raise PatchError(f"mutant {mutant.name}: expected {mutant.count} occurrence(s) of "
                         f"its patch site in function {' / '.join(mutant.functions)} of "
                         f"{where}, found {found} (the line changed, or moved to another "
                         f"function? update verification/mutants/catalog.py)")
    mutated = source
    for a, b in reversed(ranges):
        mutated = mutated[:a] + mutated[a:b].replace(mutant.old, mutant.new) + mutated[b:]
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
