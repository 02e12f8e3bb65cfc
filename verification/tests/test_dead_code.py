"""No dead code: every top-level function and class of gdn_kernels/,
strategies/, verification/ and benchmarks/ is named somewhere other than in
its own definition (any source, configuration or documentation file of the
repository; a name occurrence is enough). Entry points that only
configuration or a framework calls by name are exempt by rule (ENTRY_POINT_*,
REGISTERING_DECORATORS) or listed in ALLOWED with the reason."""

import ast
import os
import re
from collections import defaultdict
from typing import Dict, Iterator, List, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("gdn_kernels", "strategies", "verification", "benchmarks")
# Text files that can name a function: sources, configuration, docs, scripts.
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".sh", ".txt"}
# Generated, installed or cached trees: not the repository's own text.
SKIPPED_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".hypothesis",
                ".pytest_cache", ".jax_cache", "counterexamples", "bench-results"}

# Names called by a framework or by configuration, never by our own code.
ENTRY_POINT_NAMES = {"main"}                    # [project.scripts], python -m, __main__
ENTRY_POINT_PREFIXES = ("test_", "Test", "pytest_")   # pytest collection and hooks
# Decorators that register the function they decorate (the registration is
# its use): pytest fixtures, the suite's property registry, exit handlers.
REGISTERING_DECORATORS = {"pytest.fixture", "fixture", "prop", "atexit.register"}
# name -> why it stays though nothing names it (keep this short).
ALLOWED: Dict[str, str] = {
    "__getattr__": "verification/__init__.py: PEP 562 module hook, the import system calls "
                   "it for verification.adapt and verification.mixer_from_core",
}

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def package_modules(repo: str) -> Iterator[str]:
    """Paths of every .py file under the checked packages of repo."""
    for package in PACKAGES:
        for root, dirs, files in os.walk(os.path.join(repo, package)):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))


def repository_text_files(repo: str) -> Iterator[str]:
    """Paths of repo's text files (see TEXT_SUFFIXES), extensionless scripts
    included, skipping generated and installed trees."""
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS
                         and not d.endswith(".egg-info"))
        for name in sorted(files):
            if os.path.splitext(name)[1] in TEXT_SUFFIXES or "." not in name:
                yield os.path.join(root, name)


def _is_registered(node: ast.AST) -> bool:
    """Whether a REGISTERING_DECORATORS decorator (called or not) decorates it."""
    for dec in getattr(node, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if ast.unparse(target) in REGISTERING_DECORATORS:
            return True
    return False


def _is_entry_point(node: ast.AST) -> bool:
    """Whether a definition is called by name from configuration or pytest,
    or registered by its decorator."""
    return (node.name in ENTRY_POINT_NAMES or node.name.startswith(ENTRY_POINT_PREFIXES)
            or _is_registered(node))


def top_level_definitions(path: str) -> List[Tuple[str, int, int]]:
    """(name, first line, last line) of the module's top-level functions and
    classes that are not entry points; the first line is the first decorator's."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    defs = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and not _is_entry_point(node):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            defs.append((node.name, first, node.end_lineno))
    return defs


def name_occurrences(repo: str, names: Set[str]) -> Dict[str, List[Tuple[str, int]]]:
    """name -> every (file, line) of repo's text files where it occurs as a
    whole identifier."""
    seen: Dict[str, List[Tuple[str, int]]] = defaultdict(list)
    for path in repository_text_files(repo):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for lineno, line in enumerate(lines, 1):
            for word in set(IDENTIFIER.findall(line)) & names:
                seen[word].append((path, lineno))
    return seen


def dead_definitions(repo: str) -> List[str]:
    """'path:line name' of every top-level definition of repo's packages named
    nowhere outside its own definition (decorators, signature, body, docstring)."""
    defs = [(path, name, first, last) for path in package_modules(repo)
            for name, first, last in top_level_definitions(path)]
    seen = name_occurrences(repo, {name for _, name, _, _ in defs})
    dead = []
    for path, name, first, last in defs:
        if name in ALLOWED:
            continue
        outside = [(p, ln) for p, ln in seen[name] if not (p == path and first <= ln <= last)]
        if not outside:
            dead.append(f"{os.path.relpath(path, repo)}:{first} {name}")
    return dead


def test_every_top_level_function_and_class_is_used():
    dead = dead_definitions(REPO)
    assert not dead, ("top-level functions and classes named nowhere else (delete them, or "
                      "add them to ALLOWED with a reason):\n  " + "\n  ".join(dead))


def test_allow_list_names_existing_definitions():
    """An ALLOWED entry whose definition is gone is itself dead."""
    defined = {name for path in package_modules(REPO) for name, _, _ in
               top_level_definitions(path)}
    assert not set(ALLOWED) - defined, sorted(set(ALLOWED) - defined)


def test_check_finds_a_function_named_only_by_itself(tmp_path):
    """The check itself: in a tiny repository, a function named only in its
    own docstring, body and decorator is dead; one named in a README, one
    called from another module and a test function are not."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "m.py").write_text(
        "import functools\n\n"
        "@functools.lru_cache\n"
        "def lonely():\n"
        '    """lonely calls lonely."""\n'
        "    return lonely()\n\n"
        "def documented():\n"
        "    pass\n\n"
        "def called():\n"
        "    pass\n\n"
        "def test_x():\n"
        "    pass\n")
    (tmp_path / "benchmarks" / "n.py").write_text("from .m import called\ncalled()\n")
    (tmp_path / "README.md").write_text("Run `documented` first.\n")
    assert dead_definitions(str(tmp_path)) == ["benchmarks/m.py:3 lonely"]
