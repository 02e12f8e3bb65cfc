"""The house's dependencies run one way, and no module imports itself back:

    gdn_verify  <-  gdn_kernels  <-  strategies  <-  verification  <-  benchmarks

(gdn_verify, the entry that pytest loads at start-up, imports nothing of
the suite: it loads it by name once a target is named.)

Every import of every module of the four packages (the ones inside
functions too, which hide circles from a reader) is read from the source:
no module imports a package to its right, and the imports between modules
form no circle. Test modules (test_*.py) may import any package: they
verify all of them (verification/tests/test_bench_smoke.py runs the benchmarks)."""

import ast
import os
from typing import Dict, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("gdn_verify", "gdn_kernels", "strategies", "verification", "benchmarks")


def _modules() -> Dict[str, str]:
    """Dotted module name -> path, for every non-test module of the packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            if "__pycache__" in folder:
                continue
            for name in files:
                if name.endswith(".py") and not name.startswith("test_"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imported(module: str, path: str, node, modules) -> List[str]:
    """The package modules an import statement of `module` names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            if not path.endswith("__init__.py"):
                parts = parts[:-1]
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    out = []
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name != module:
            out.append(name)
    return out


def import_graph() -> Dict[str, Set[str]]:
    modules = _modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_imported(module, path, node, modules))
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _rank(module: str) -> int:
    return PACKAGES.index(module.split(".")[0])


def test_no_module_imports_a_package_to_its_right():
    graph = import_graph()
    upward = sorted((a, b) for a in graph for b in graph[a] if _rank(b) > _rank(a))
    assert not upward, upward


def test_the_imports_form_no_circle():
    assert circles(import_graph()) == []


def test_the_checks_see_a_circle_and_an_upward_arrow():
    graph = {"gdn_kernels.a": {"strategies.b"}, "strategies.b": {"gdn_kernels.a"}}
    assert circles(graph) == [["gdn_kernels.a", "strategies.b"]]
    assert _rank("strategies.b") > _rank("gdn_kernels.a")
    assert "verification.engine.registry" in import_graph()["verification.engine.harness"]


FIXTURE_KERNELS = "verification.fixture_kernels"


def _is_fixture(module: str) -> bool:
    return module == FIXTURE_KERNELS or module.startswith(FIXTURE_KERNELS + ".")


def test_the_engine_never_imports_the_fixture_kernels():
    """The kernels that exist to test the suite stay apart from it: no module
    of the suite imports them (properties and tests name them as targets,
    by module); they import the suite's public API like any kernel."""
    graph = import_graph()
    assert any(_is_fixture(m) for m in graph)
    inward = sorted((a, b) for a in graph for b in graph[a]
                    if _is_fixture(b) and not _is_fixture(a))
    assert not inward, inward


FRONT_ENDS = ("verification.plugin", "verification.cli", "verification.summary",
              "verification.fixtures")


def test_the_engine_never_imports_a_front_end():
    """verification.engine (how a run happens) and the properties run under
    any front end: neither imports the pytest plugin, the CLI or the
    summary's text."""
    graph = import_graph()
    inner = [m for m in graph if m.startswith(("verification.engine", "verification.properties",
                                               "verification.targets"))]
    assert "verification.engine.harness" in inner
    outward = sorted((a, b) for a in inner for b in graph[a] if b in FRONT_ENDS)
    assert not outward, outward


# The suite's top level: its few front-end modules beside the rooms (engine,
# targets, properties, mutants, fixture_kernels, tests).
MAX_TOP_LEVEL_MODULES = 10


def test_the_suite_is_grouped_by_role():
    """verification/ holds a few modules beside its subpackages, no test
    module among them; every fixture kernel lives under fixture_kernels/."""
    suite = os.path.join(ROOT, "verification")
    top = sorted(f for f in os.listdir(suite) if f.endswith(".py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES and not any(
        f.startswith("test_") for f in top), top
    rooms = {f for f in os.listdir(suite) if os.path.isfile(os.path.join(suite, f, "__init__.py"))}
    assert {"engine", "targets", "properties", "mutants", "fixture_kernels", "tests"} <= rooms
    assert not rooms & {"wrong_targets", "foreign_targets", "convention_fixtures",
                        "author_fixture"}, rooms

