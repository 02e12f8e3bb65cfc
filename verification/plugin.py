"""The suite's pytest plugin, installed under the `pytest11` entry point
`gdn_verify`.

Inert unless asked for: in a test session that names no target it adds its
command-line options and nothing else (no environment, XLA flag or
Hypothesis profile change, no test of ours collected). It becomes active
with a target, from (first found)

  --gdn-target MODULE[:IMPL][@AXIS=N,...]   the GDN_TARGET environment variable
  gdn_target = ...                          in the pytest ini file (this repository's
                                            pyproject.toml: gdn_kernels:pallas)

and then runs the suite on it from any directory: the invocation directory
is importable (as under `python -m pytest`), the suite's compile settings
and Hypothesis profiles apply, and with no test paths given the suite's
tests are collected: the properties for any target, plus this
repository's self-tests for gdn_kernels targets (--gdn-scope). A target
that cannot be imported or resolved is a usage error (exit 4).
"""

from __future__ import annotations

import json
import os
import time

import pytest

TARGET_OPTION, TARGET_INI, TARGET_ENV = "--gdn-target", "gdn_target", "GDN_TARGET"
SCOPES = ("properties", "all")
SUITE_DIR = os.path.dirname(os.path.abspath(__file__))
PROPERTY_TESTS = os.path.join(SUITE_DIR, "test_properties.py")
STATS_KEY = "gdn_property_stats"
EXAMPLES_ENV = "GDN_EXAMPLES"      # the same as --gdn-examples
LONG_MARKER = "long_running"       # tests sorted first (see pytest_collection_modifyitems)
long_running = getattr(pytest.mark, LONG_MARKER)       # the self-tests' decorator


def pytest_addoption(parser):
    group = parser.getgroup("gdn-verify", "GDN kernel verification (active with a target)")
    group.addoption(TARGET_OPTION, default=None, metavar="MODULE[:IMPL]",
                    help=f"verify this kernel module (env {TARGET_ENV}; ini {TARGET_INI}); "
                         "without a target the plugin does nothing")
    group.addoption("--gdn-properties", default=None, metavar="ID[,ID...]",
                    help="run only these registered properties (by id; 'all' = every "
                         "property, no other test; 'sharded-subset' = those declared "
                         "on_sharded_target)")
    group.addoption("--gdn-scope", default=None, choices=SCOPES,
                    help="what runs: the properties, or all tests including this "
                         "repository's self-tests (default: all for gdn_kernels targets, "
                         "properties for any other)")
    group.addoption("--gdn-strict", action="store_true", default=False,
                    help="a property that cannot check an example on the target fails "
                         "instead of reporting 'not checkable'")
    group.addoption("--gdn-known-failures", default=None, metavar="FILE",
                    help="known failures of a partial implementation (property | tensor "
                         "| reason a line): XFAIL; one that passes is XPASS and fails")
    group.addoption("--gdn-examples", default=None, type=int, metavar="N",
                    help="examples per property (before its weight) instead of the "
                         f"profile's (env {EXAMPLES_ENV})")
    group.addoption("--gdn-no-compile-cache", action="store_true", default=False,
                    help="do not use the persistent compilation cache (default: on, in "
                         "JAX_COMPILATION_CACHE_DIR or <user cache>/gdn-verify/jax)")
    group.addoption("--gdn-shard", default=None, metavar="I/N",
                    help="run only shard I of N (1-based) of the selected tests: a stable "
                         "split by test id, for CI jobs whose reports `gdn-verify "
                         "merge-reports` joins")
    parser.addini(TARGET_INI, "the kernel module the gdn-verify suite runs on "
                              "(activates the suite)", default=None)


def requested_target(config):
    """The target spec this session asks for, or None (the plugin stays inert)."""
    return (config.getoption(TARGET_OPTION, default=None) or os.environ.get(TARGET_ENV)
            or config.getini(TARGET_INI) or None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    spec = requested_target(config)
    if spec:
        from . import fixtures
        config.pluginmanager.register(Suite(config, spec), "gdn_verify_suite")
        config.pluginmanager.register(fixtures, "gdn_verify_fixtures")


class Suite:
    """The active suite: its target, profile, options and the run's hooks."""

    def __init__(self, config, spec: str):
        from . import compile_cache, compile_settings
        # before this process's first XLA computation (see compile_settings)
        self.compile_settings = compile_settings.apply()
        self.compile_cache = compile_cache.configure(
            not config.getoption("--gdn-no-compile-cache"))
        from .targets import Target, TargetError, make_importable
        make_importable(str(config.invocation_params.dir))
        try:
            self.target = Target.parse(spec)
        except TargetError as err:
            raise pytest.UsageError(str(err)) from None
        os.environ[TARGET_ENV] = self.target.spec      # workers, mesh workers, replays
        from strategies import lattice
        lattice.declare_beyond_contract(self.target.declaration.supports.chunk_sizes)
        limits = self.target.declaration.limits
        lattice.declare_limits(limits if limits.declared else None)
        from . import harness
        from .profiles import register_profiles, selected_profile
        from hypothesis import settings
        examples = config.getoption("--gdn-examples") or int(
            os.environ.get(EXAMPLES_ENV, "0") or 0)
        register_profiles(examples=examples or None)
        settings.load_profile(selected_profile())
        self.config = config
        self.scope = config.getoption("--gdn-scope") or (
            "all" if self.target.is_ours else "properties")
        options = harness.RunOptions(strict=bool(config.getoption("--gdn-strict")))
        known = config.getoption("--gdn-known-failures")
        if known:
            from . import known_failures
            from .properties import load_all
            try:
                options.known = known_failures.load(known, load_all())
            except ValueError as err:
                raise pytest.UsageError(str(err)) from None
        # this run's state: options, per-property statistics, failures
        self.session = harness.begin_session(harness.Session(options))
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            config.args[:] = [SUITE_DIR if self.scope == "all" else PROPERTY_TESTS]
        self.start, self.compiles0 = time.perf_counter(), self._compiles()
        self.worker_compiles = self.worker_hits = 0
        self.hits0 = self._hits()
        self.test_seconds: dict = {}
        config.addinivalue_line("markers", f"{harness.MARKER}(id): the test of registered "
                                           "property <id> (verification/registry.py)")
        config.addinivalue_line("markers", f"{LONG_MARKER}: a test of a minute or more "
                                           "(whole suite runs in subprocesses): run first")

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _hits() -> int:
        from . import runners
        return runners.cache_hit_count()

    def cache_hits(self) -> int:
        return self._hits() - self.hits0 + self.worker_hits

    @staticmethod
    def _compiles() -> int:
        from . import runners
        return runners.compile_count()

    def profile_name(self) -> str:
        from hypothesis import settings
        from .profiles import selected_profile
        return settings.get_current_profile_name() or selected_profile()

    # ------------------------------------------------------------ collection
    def pytest_report_header(self, config):
        from hypothesis import settings
        s = settings()
        return [f"gdn-verify: target={self.target.spec} profile={self.profile_name()} "
                f"max_examples={s.max_examples} derandomize={s.derandomize} "
                f"scope={self.scope}" + (" strict" if self._strict() else ""),
                f"gdn-verify: {self.compile_settings}",
                f"gdn-verify: {self.compile_cache}",
                f"gdn-verify: {_shape_budget_line()}"] + [
                    f"gdn-verify: adapter: {line}"
                    for line in self.target.declaration.conventions] + (
                    [f"gdn-verify: declared tolerance (x the policy's bound): "
                     f"{_factors_text(self.target.declaration.tolerance)}"]
                    if self.target.declaration.tolerance else [])

    def _strict(self) -> bool:
        return self.session.options.strict

    def pytest_collection_modifyitems(self, config, items):
        from . import harness, shards
        if self.scope == "properties":
            _keep(config, items, [i for i in items if i.get_closest_marker(harness.MARKER)])
        _select_properties(config, items)
        shard = config.getoption("--gdn-shard", default=None)
        if shard:
            try:
                i, n = shards.parse_shard(shard)
            except ValueError as err:
                raise pytest.UsageError(f"--gdn-shard: {err}") from None
            mine = set(shards.shard_of(sorted(item.nodeid for item in items), (i, n)))
            _keep(config, items, [item for item in items if item.nodeid in mine])
        # long tests first (stable): pytest-xdist hands each worker a
        # contiguous share, so they start early instead of leaving one core
        # idle at the end
        items.sort(key=lambda item: item.get_closest_marker(LONG_MARKER) is None)

    # ------------------------------------------------------------ running
    def pytest_runtest_setup(self, item):
        self.session.last_failure.clear()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        from . import harness
        outcome = yield
        report = outcome.get_result()
        if report.when != "call":
            return
        if report.failed:
            self._write_counterexamples(report)
        mark = item.get_closest_marker(harness.MARKER)
        if mark is not None and mark.args[0] in self.session.stats:
            one = harness.stats_json({mark.args[0]: self.session.stats[mark.args[0]]})
            report.user_properties.append((STATS_KEY, json.dumps(one)))

    def _write_counterexamples(self, report) -> None:
        """One file per failure class of the test's properties: the last
        (shrunk) failing case of each; its path goes to the class's row."""
        from . import counterexamples
        from .tolerance import format_table
        for (prop, klass), (case, target, rows) in list(self.session.last_failure.items()):
            table = format_table(rows) if rows else "(no error table: the check raised)"
            path = counterexamples.write(prop, case, target.spec, self.profile_name(), rows,
                                         table, failure_class=klass)
            if prop in self.session.stats:      # a property's test, not a meta-test's hunt
                self.session.stats[prop].add_failure(klass, 0.0, examples=0,
                                                     file=_shown_path(path))
            report.sections.append((f"gdn-verify counterexample [{klass}]",
                                    f"shrunk case written to {path}\nreplay: "
                                    f"{counterexamples.replay_command(path)}\n{table}"))
        self.session.last_failure.clear()

    def pytest_runtest_logreport(self, report):
        from . import harness
        self.test_seconds[report.nodeid] = (self.test_seconds.get(report.nodeid, 0.0)
                                            + report.duration)
        payload = dict(report.user_properties).get(STATS_KEY)
        if payload is None:
            return
        data = json.loads(payload)
        if getattr(report, "node", None) is not None:     # from a pytest-xdist worker
            harness.merge_stats_json(data)
        name, st = next(iter(data.items()))
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            if getattr(terminal, "_width_of_current_line", 0):   # after xdist's dots
                terminal.write("\n")
            terminal.write_line(f"gdn-verify: {progress_line(name, st)}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """pytest-xdist controller: add a finished worker's XLA compiles."""
        output = getattr(node, "workeroutput", {})
        self.worker_compiles += int(output.get("gdn_compiles", 0))
        self.worker_hits += int(output.get("gdn_cache_hits", 0))

    def pytest_sessionfinish(self, session, exitstatus):
        from . import harness
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:          # a pytest-xdist worker: report to the controller
            workeroutput["gdn_compiles"] = str(self.total_compiles())
            workeroutput["gdn_cache_hits"] = str(self.cache_hits())
            return
        path = os.environ.get("GDN_STATS_FILE")
        if path:
            with open(path, "w") as f:
                json.dump({"exitstatus": int(exitstatus), "target": self.target.spec,
                           "shard": self.config.getoption("--gdn-shard") or "1/1",
                           "profile": self.profile_name(),
                           "properties": harness.stats_json(),
                           "compiles": self.total_compiles(),
                           "cache_hits": self.cache_hits(),
                           "test_seconds": self.test_seconds}, f)

    def total_compiles(self) -> int:
        return self._compiles() - self.compiles0 + self.worker_compiles

    def pytest_terminal_summary(self, terminalreporter):
        if not self.session.stats:
            return
        terminalreporter.section("gdn-verify summary")
        for line in summary_lines(self):
            terminalreporter.write_line(line)


def _keep(config, items, keep):
    """Deselect every item not in keep (order kept)."""
    keep_ids = {id(item) for item in keep}
    drop = [item for item in items if id(item) not in keep_ids]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = [item for item in items if id(item) in keep_ids]


def selected_ids(option: str):
    """The property ids of a --gdn-properties value (UsageError if unknown)."""
    from . import registry
    from .properties import load_all
    ids = [i.strip() for i in option.split(",") if i.strip()]
    every = load_all()
    if ids == ["all"]:
        return list(every)
    if ids == [registry.SHARDED_SUBSET]:
        return [p.id for p in every.values() if p.on_sharded_target]
    try:
        return [p.id for p in registry.select(ids)]
    except ValueError as err:
        raise pytest.UsageError(f"--gdn-properties: {err}") from None


def _select_properties(config, items):
    from . import harness
    option = config.getoption("--gdn-properties", default=None)
    if not option:
        return
    wanted = set(selected_ids(option))
    keep = [i for i in items
            if (m := i.get_closest_marker(harness.MARKER)) is not None and m.args[0] in wanted]
    missing = wanted - {i.get_closest_marker(harness.MARKER).args[0] for i in keep}
    if missing:
        raise pytest.UsageError(f"--gdn-properties: no test collected for {sorted(missing)}")
    _keep(config, items, keep)


def _shape_budget_line() -> str:
    """The loaded profile's covering of the shape lattice: its compile budget."""
    from strategies import lattice
    kind = lattice.current_covering()
    beyond = lattice.declared_beyond_contract()
    mixer, delta = lattice.mixer_geometries(beyond), lattice.delta_geometries(beyond)
    counts = [len(lattice.covering(rows, tuple(knobs), kind)) for rows, knobs in
              ((mixer, lattice.MIXER_KNOBS), (delta, lattice.DELTA_KNOBS))]
    return (f"shapes: the lattice's {kind} covering, {counts[0]} mixer and {counts[1]} "
            f"delta-rule geometries (of {len(mixer)} and {len(delta)})"
            + (f"; chunk sizes beyond the contract, declared: {list(beyond)}" if beyond else ""))


# ---------------------------------------------------------------- the report
def _worst_text(row) -> str:
    """The worst row as the verdict judged it: relative and absolute error,
    or the absolute error alone for a row judged by the near-zero floor."""
    if not row.bound_rel and not row.bound_abs:
        return "all exact/structural checks"
    if row.near_zero:
        measure = f"abs {row.max_abs:.2e} / {row.bound_abs:.1e} (near-zero)"
    else:
        measure = f"rel {row.rel_l2:.2e} / {row.bound_rel:.1e}"
    return f"{row.name}: {measure}, ratio {row.ratio:.2f}"


def _worst_row(st):
    """The worst row of a property's statistics (PropertyStats or its JSON)."""
    from .tolerance import TensorError
    rows = ([TensorError(**r) for r in st["worst"]] if isinstance(st, dict)
            else list(st.worst.values()))
    return max(rows, key=lambda r: r.ratio, default=None)


def progress_line(name: str, st: dict) -> str:
    """One line per finished property: verdict, examples, worst ratio, time."""
    worst = _worst_row(st)
    ratio = f", worst ratio {worst.ratio:.2f} ({worst.name})" if worst and worst.bound_rel else ""
    nc = f", {st['not_checkable']} not checkable" if st["not_checkable"] else ""
    raised = f", {st['raised']} raised" if st.get("raised") else ""
    checked = st["examples"] - st.get("unresolved", 0) - st.get("raised", 0)
    return (f"{name}: {st['verdict'] or '?'}: {checked} example(s) checked{raised}{nc}{ratio} "
            f"[{st['seconds']:.0f} s]")


def summary_lines(suite: Suite):
    from . import harness
    from .shards import projection_line
    lines = []
    head = (f"{'property':<42}{'verdict':>14}{'examples':>9}{'n/c':>5}{'fail':>5}"
            f"{'claims':>8}{'compiles':>9}{'ex/comp':>8}{'time s':>8}  worst tensor (error/bound)")
    lines.append(head)
    lines.append("-" * (len(head) + 10))
    for name in sorted(suite.session.stats):
        st = suite.session.stats[name]
        worst = _worst_row(st)
        w = _worst_text(worst) if worst else "-"
        if st.reasons:
            w += f"; not checkable: {harness.reasons_text(st)}"
        label = suite.target.declaration.mixer_label
        if label and st.mixer_examples:
            w = f"[{label}] {w}"
        if st.classes:
            w += f"; counterexample {_class_file(st, st.worst_class)}"
        per = f"{st.examples / st.compiles:.1f}" if st.compiles else "-"
        met, unmet = claim_status(name, st)
        lines.append(f"{name:<42}{st.verdict or '-':>14}{st.examples:>9}{st.not_checkable:>5}"
                     f"{st.failures:>5}{f'{len(met)}/{len(met) + len(unmet)}':>8}"
                     f"{st.compiles:>9}{per:>8}{st.seconds:>8.1f}  {w}")
        lines += failure_class_lines(st)
        if st.checked:      # a property not checkable at all says why in its row
            lines += [f"    claim not met: {claim}: {why}" for claim, why in unmet.items()]
    lines += deviation_lines(suite.target.declaration, suite.session.stats)
    lines += tolerance_lines(suite.target.declaration, suite.session.stats)
    lines.append(projection_line(list(suite.test_seconds.values()), "test-session"))
    lines += verdict_lines(suite, suite.session.stats)
    return lines


def claim_status(name: str, st) -> tuple:
    """(claims the property's checked examples met, {claim not met: why})
    for the loaded profile's claims (verification/claims.py)."""
    from strategies import lattice
    from .claims import claims_of
    from .properties import load_all
    p = load_all().get(name)
    if p is None:
        return [], {}
    claims = claims_of(p, lattice.current_covering())
    met = sorted(c for c in claims if st.claims_met.get(c))
    unmet = {c: st.claims_unmet.get(c, "no checked example met it") for c in claims
             if c not in met}
    unmet.update({c: why for c, why in st.claims_unmet.items() if c not in claims})
    return met, unmet


def _shown_path(path: str) -> str:
    """path relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _class_file(st, klass) -> str:
    return st.classes[klass]["file"] or "(not written)"


def failure_class_lines(st) -> list:
    """One line per failure class of a property, the worst first: each is
    its own finding, with its own counterexample file."""
    order = sorted(st.classes, key=lambda k: -st.classes[k]["worst"])
    return [f"    failure class {k}: {st.classes[k]['examples']} failing run(s), worst ratio "
            f"{st.classes[k]['worst']:.3g}, counterexample {_class_file(st, k)}"
            + (f"; {st.classes[k]['message']}" if st.classes[k].get("message") else "")
            for k in order]


def deviation_lines(declaration, stats) -> list:
    """The tensors that held only at the target's declared compute precision,
    one row per tensor over every property: how far beyond the contract's
    float32 bound they went, in how many examples, and where."""
    from .tolerance import PRECISIONS
    tensors = _beyond_table(stats, "deviations")
    if not tensors:
        return []
    declared = PRECISIONS[declaration.supports.compute_precision]
    lines = ["", f"deviates from the contract's float32 state and accumulation, within the "
                 f"declared compute precision {declared.name!r} ({declared.model}):",
             f"    {'tensor':<16}{'x contract bound':>18}{'examples':>10}  properties"]
    for tensor in sorted(tensors, key=lambda t: -tensors[t]["worst"]):
        row = tensors[tensor]
        lines.append(f"    {tensor:<16}{row['worst']:>18.3g}{row['examples']:>10}  "
                     f"{', '.join(sorted(row['properties']))}")
    return lines


def _factors_text(factors) -> str:
    return ", ".join(f"{tensor} x{factor:g}" for tensor, factor in sorted(factors.items()))


def _beyond_table(stats, field: str) -> dict:
    """tensor -> {"examples", "worst", "properties"} over every property's
    `field` table (deviations, tolerated)."""
    tensors = {}
    for name, st in stats.items():
        for tensor, d in getattr(st, field).items():
            row = tensors.setdefault(tensor, {"examples": 0, "worst": 0.0, "properties": []})
            row["examples"] += d["examples"]
            row["worst"] = max(row["worst"], d["worst"])
            row["properties"].append(name)
    return tensors


def tolerance_lines(declaration, stats) -> list:
    """The tensors that held only at the author's declared tolerance, one
    row per tensor over every property (its factor, how far beyond the
    policy's bound it went, in how many examples, where), and the declared
    tensors no row needed (a misspelt name shows here)."""
    factors = dict(declaration.tolerance)
    if not factors:
        return []
    tensors = _beyond_table(stats, "tolerated")
    lines = ["", f"held at the declared tolerance (the author's factor over the policy's "
                 f"bound; declared: {_factors_text(factors)}):"]
    if tensors:
        lines.append(f"    {'tensor':<16}{'factor':>8}{'x policy bound':>16}{'examples':>10}"
                     f"  properties")
    for tensor in sorted(tensors, key=lambda t: -tensors[t]["worst"]):
        row = tensors[tensor]
        lines.append(f"    {tensor:<16}{factors.get(tensor, 0):>8g}{row['worst']:>16.3g}"
                     f"{row['examples']:>10}  {', '.join(sorted(row['properties']))}")
    unused = sorted(set(factors) - set(tensors))
    if unused:
        lines.append(f"    declared, never needed in this run: {', '.join(unused)}")
    return lines


def deviating_tensors(stats) -> list:
    """The tensors with a deviation row in any property, sorted."""
    return sorted({t for st in stats.values() for t in st.deviations})


def verdict_lines(suite: Suite, stats) -> list:
    """The summary's last lines: what was verified, on what, said plainly."""
    from . import harness
    from .tolerance import CONTRACT_PRECISION
    by = {}
    for name, st in stats.items():
        by.setdefault(st.verdict or "-", []).append(name)
    examples = sum(st.checked for st in stats.values())
    raised = sum(st.raised for st in stats.values())
    compiles = suite.total_compiles()
    lines = [f"target {suite.target.spec} (profile {suite.profile_name()}, scope "
             f"{suite.scope}): {len(stats)} properties, {examples} examples checked, "
             + (f"{raised} raised (not checked), " if raised else "")
             + f"{compiles} programs built ({suite.cache_hits()} read from the compile cache)"
             + (f", {examples / compiles:.2f} examples per program" if compiles else "")
             + f", {time.perf_counter() - suite.start:.0f} s"]
    lines += [f"  adapter: {line}" for line in suite.target.declaration.conventions]
    held = by.get(harness.HELD, [])
    precision = suite.target.declaration.supports.compute_precision
    lines.append(f"  held on the target: {len(held)} properties"
                 + (f" (bfloat16 cases within its declared compute precision {precision!r})"
                    if precision != CONTRACT_PRECISION else ""))
    tolerated = _beyond_table(stats, "tolerated")
    if tolerated:
        lines.append("  held at the declared tolerance (not within the policy's bound): "
                     + ", ".join(f"{t} x{suite.target.declaration.tolerance.get(t, 0):g} "
                                 f"(worst {tolerated[t]['worst']:.3g}x the policy's bound)"
                                 for t in sorted(tolerated)))
    deviating = deviating_tensors(stats)
    if deviating:
        lines.append(f"  deviates from the contract's float32 (not failures): "
                     f"{', '.join(deviating)}")
    status = [claim_status(name, st) for name, st in stats.items() if st.checked]
    met = sum(len(m) for m, _ in status)
    unmet = sum(len(u) for _, u in status)
    lines.append(f"  coverage claims met by the checked examples: {met} of {met + unmet}"
                 + (f" ({unmet} not met: listed under their properties)" if unmet else ""))
    nc = by.get(harness.NOT_CHECKABLE, [])
    partly = sum(st.not_checkable for n, st in stats.items() if n not in nc)
    lines.append(f"  not checkable: {len(nc)} properties"
                 + (f" ({', '.join(sorted(nc))})" if nc else "")
                 + (f"; {partly} further example(s) not checkable" if partly else ""))
    for verdict in (harness.XFAIL, harness.XPASS, harness.FAILED):
        names = by.get(verdict, [])
        if names or verdict == harness.FAILED:
            lines.append(f"  {verdict}: {len(names)}" + (f" ({', '.join(sorted(names))})"
                                                        if names else ""))
    return lines
