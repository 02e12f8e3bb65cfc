"""The suite's pytest plugin: the run on a target, its hooks by role
(SuiteRun, Collection, Recording, Summary) and the fixtures.

Activated by the pytest11 entry point `gdn_verify` (gdn_verify/pytest_plugin.py,
which declares the options and imports nothing of the suite until a target
is named: --gdn-target, GDN_TARGET, or `gdn_target` in the ini file; this
repository's pyproject.toml names gdn_kernels:pallas). It then runs the
suite on the target from any directory: the invocation directory is
importable (as under `python -m pytest`), the suite's compile settings and
Hypothesis profiles apply, and with no test paths given the suite's tests
are collected: the properties for any target, plus this repository's
self-tests for gdn_kernels targets (--gdn-scope). A target that cannot be
imported or resolved is a usage error (exit 4).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sys
import time
from typing import Dict

import pytest

from gdn_verify.pytest_plugin import (EXAMPLES_ENV, HANG_OPTION, PROGRESS_EVERY_S,
                                      PROGRESS_OPTION, TARGET_ENV, report_path)

SUITE_DIR = os.path.dirname(os.path.abspath(__file__))
PROPERTY_TESTS = os.path.join(SUITE_DIR, "tests", "test_properties.py")
STATS_KEY = "gdn_property_stats"
LONG_MARKER = "long_running"       # tests sorted first (see pytest_collection_modifyitems)
long_running = getattr(pytest.mark, LONG_MARKER)       # the self-tests' decorator


def activate(config, spec: str) -> None:
    """The suite's run on target `spec` in this pytest session (called by
    the entry point, gdn_verify.pytest_plugin, once a target is named): its
    hooks by role, and the fixtures."""
    from . import fixtures
    run = SuiteRun(config, spec)
    config.pluginmanager.register(run, fixtures.RUN_PLUGIN)
    config.pluginmanager.register(Collection(run), "gdn_verify_collection")
    config.pluginmanager.register(Recording(run), "gdn_verify_recording")
    config.pluginmanager.register(Summary(run), "gdn_verify_summary")
    config.pluginmanager.register(fixtures, "gdn_verify_fixtures")


class SuiteRun:
    """The active suite's run: its target, profile, scope and options (set
    up once, before any XLA computation), its per-property statistics
    (harness.Session) and the counters the summary reads (clock, programs
    built, compile-cache reads, seconds per test)."""

    def __init__(self, config, spec: str):
        from .engine import compile_cache, compile_settings, cpu_pool
        # before this process's first XLA computation (see compile_settings)
        self.compile_settings = compile_settings.apply()
        self.cpu_pool = cpu_pool.apply()
        _arm_watchdog(config)
        self.compile_cache = compile_cache.configure(
            not config.getoption("--gdn-no-compile-cache"))
        from .targets import Target, TargetError, make_importable
        make_importable(str(config.invocation_params.dir))
        try:
            self.target = Target.parse(spec)
        except TargetError as err:
            raise pytest.UsageError(str(err)) from None
        os.environ[TARGET_ENV] = self.target.spec      # workers, mesh workers, replays
        from .targets import declare_to_lattice
        declare_to_lattice(self.target.declaration)
        from .engine import harness
        from .engine.profiles import register_profiles, selected_profile
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
            from .engine import known_failures
            from .properties import load_all
            try:
                options.known = known_failures.load(known, load_all())
            except ValueError as err:
                raise pytest.UsageError(str(err)) from None
        # this run's state: options, per-property statistics, failures
        self.session = harness.begin_session(harness.Session(options))
        progress = Progress(config, config.getoption(PROGRESS_OPTION))
        self.session.progress, self.session.announce = progress.line, progress.say
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            config.args[:] = [SUITE_DIR if self.scope == "all" else PROPERTY_TESTS]
        self.start, self.compiles0 = time.perf_counter(), self._compiles()
        self.worker_compiles = self.worker_hits = 0
        self.hits0 = self._hits()
        self.test_seconds: dict = {}
        config.addinivalue_line("markers", f"{harness.MARKER}(id): the test of registered "
                                           "property <id> (verification/engine/registry.py)")
        config.addinivalue_line("markers", f"{LONG_MARKER}: a test of a minute or more "
                                           "(whole suite runs in subprocesses): run first")

    @staticmethod
    def _hits() -> int:
        from .engine import runners
        return runners.cache_hit_count()

    def cache_hits(self) -> int:
        return self._hits() - self.hits0 + self.worker_hits

    @staticmethod
    def _compiles() -> int:
        from .engine import runners
        return runners.compile_count()

    def total_compiles(self) -> int:
        return self._compiles() - self.compiles0 + self.worker_compiles

    def profile_name(self) -> str:
        from hypothesis import settings
        from .engine.profiles import selected_profile
        return settings.get_current_profile_name() or selected_profile()

    def strict(self) -> bool:
        return self.session.options.strict


def _arm_watchdog(config) -> None:
    """The watchdog's bound for this process and its workers (--gdn-hang-after
    over GDN_HANG_AFTER_S), checked here. A controller (not a pytest-xdist
    worker) makes the folder its workers leave their records of a hang in,
    its own even inside another run's process tree, removed when the
    process exits (however the session ends, a usage error included)."""
    import atexit
    import tempfile
    from .engine import watchdog
    bound = config.getoption(HANG_OPTION, default=None)
    if bound is not None:
        os.environ[watchdog.AFTER_ENV] = str(bound)
    try:
        watchdog.after_s()
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None
    if getattr(config, "workerinput", None) is None:
        folder = tempfile.mkdtemp(prefix="gdn-hangs-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ[watchdog.RECORDS_ENV] = folder


class Progress:
    """A line while a long property runs: its examples done of planned,
    every `every_s` seconds of it (--gdn-progress-every). A session that
    runs its tests itself writes it on the terminal reporter; a
    pytest-xdist worker, whose terminal output goes nowhere, writes it on
    its standard error, which pytest-xdist leaves the controller's (the
    terminal's), named by the worker: `gdn-verify [gw1]: ...`."""

    def __init__(self, config, every_s: float = PROGRESS_EVERY_S, clock=time.perf_counter):
        self.config, self.every_s, self.clock = config, every_s, clock
        self.worker = (getattr(config, "workerinput", None) or {}).get("workerid")
        self.last: Dict[str, float] = {}

    def line(self, prop: str, stats, planned: int) -> None:
        now = self.clock()
        last = self.last.setdefault(prop, now - stats.seconds)
        if now - last < self.every_s:
            return
        self.last[prop] = now
        if stats.failures:
            self.say(f"{prop}: failing since example {stats.first_failure_at}, searching and "
                     f"shrinking: {stats.examples} example(s) run, {stats.failures} failing "
                     f"[{stats.seconds:.0f} s]")
            return
        of = f" of {planned} planned" if planned else ""
        self.say(f"{prop}: running, {stats.examples} example(s) done{of} [{stats.seconds:.0f} s]")

    def say(self, text: str) -> None:
        """One line past pytest's capture: on the terminal, or a worker's
        standard error."""
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if self.worker is not None:
                sys.stderr.write(f"gdn-verify [{self.worker}]: {text}\n")
                sys.stderr.flush()
                return
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is None:
                return
            if getattr(terminal, "_width_of_current_line", 0):
                terminal.write("\n")
            terminal.write_line(f"gdn-verify: {text}")


class Collection:
    """What the run collects, and the header that says so: the properties
    (or every test, scope all), --gdn-properties, a --gdn-shard's share,
    long tests first."""

    def __init__(self, run: SuiteRun):
        self.run = run

    def pytest_report_header(self, config):
        return self.header_lines()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session):
        """Under -q (gdn-verify's runs) pytest prints no header: the run's
        header is written here, the first lines of the run."""
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        if (terminal is None or session.config.get_verbosity() >= 0
                or getattr(session.config, "workerinput", None) is not None):
            return
        for line in self.header_lines():
            terminal.write_line(line)

    def header_lines(self) -> list:
        """The run's header: target, profile, versions, compile settings and
        cache, the shape budget, and the adapter's and tolerance's lines."""
        from hypothesis import settings
        from .engine.profiles import hypothesis_note
        from .engine.counterexamples import versions
        from .summary import factors_text, shape_budget_line
        run, s = self.run, settings()
        return [f"gdn-verify: target={run.target.spec} profile={run.profile_name()} "
                f"max_examples={s.max_examples} derandomize={s.derandomize} "
                f"scope={run.scope}" + (" strict" if run.strict() else ""),
                "gdn-verify: versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
                f"gdn-verify: {run.compile_settings}",
                f"gdn-verify: {run.cpu_pool}",
                f"gdn-verify: {run.compile_cache}",
                f"gdn-verify: {shape_budget_line()}"] + [
                    f"gdn-verify: {line}" for line in (hypothesis_note(),) if line] + [
                    f"gdn-verify: adapter: {line}"
                    for line in run.target.declaration.conventions] + (
                    [f"gdn-verify: declared tolerance (x the policy's bound): "
                     f"{factors_text(run.target.declaration.tolerance)}"]
                    if run.target.declaration.tolerance else [])

    def pytest_collection_modifyitems(self, config, items):
        from .engine import harness, shards
        if self.run.scope == "properties":
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


class Recording:
    """What each test leaves: its property's statistics (carried from a
    pytest-xdist worker in its report), a counterexample file per failure
    class, a progress line, the seconds and compiles of the run, and the
    JSON report (--gdn-report, or GDN_STATS_FILE)."""

    def __init__(self, run: SuiteRun):
        self.run = run

    def pytest_runtest_setup(self, item):
        self.run.session.last_failure.clear()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        from .engine import harness
        outcome = yield
        report = outcome.get_result()
        if report.when != "call":
            return
        mark = item.get_closest_marker(harness.MARKER)
        if report.failed:
            written = self._write_counterexamples(report)
            if mark is not None and written:
                _shorten(report, mark.args[0], written)
        stats = self.run.session.stats
        if mark is not None and mark.args[0] in stats:
            one = harness.stats_json({mark.args[0]: stats[mark.args[0]]})
            report.user_properties.append((STATS_KEY, json.dumps(one)))

    def _write_counterexamples(self, report) -> list:
        """One file per failure class of the test's properties: the last
        (shrunk) failing case of each; its path and its ratio go to the
        class's row. Returns (failure class, shrunk ratio, the worst failing
        row's note, path) of each."""
        from .engine import counterexamples
        from .summary import shown_path
        from .tolerance import format_table
        session, written = self.run.session, []
        failures = list(session.last_failure.items())
        for (prop, klass), (case, target, rows) in failures:
            table = format_table(rows) if rows else "(no error table: the check raised)"
            found = _diagnosis(prop, target, case) if prop in session.stats else None
            path = counterexamples.write(prop, case, target.spec, self.run.profile_name(),
                                         rows, table, failure_class=klass, diagnosis=found)
            failing = sorted((r for r in rows if not r.passed), key=lambda r: -r.ratio)
            shrunk = failing[0].ratio if failing else None
            note = failing[0].note if failing else ""
            if prop in session.stats:      # a property's test, not a meta-test's hunt
                session.stats[prop].add_failure(klass, 0.0, examples=0, file=shown_path(path),
                                                shrunk=shrunk, diagnosis=found)
            report.sections.append((f"gdn-verify counterexample [{klass}]",
                                    f"shrunk case written to {path}\nreplay: "
                                    f"{counterexamples.replay_command(path)}\n{table}"))
            written.append((klass, shrunk, note, shown_path(path)))
        session.last_failure.clear()
        return written

    @pytest.hookimpl(trylast=True)     # after the JUnit XML has the full report
    def pytest_runtest_logreport(self, report):
        from .engine import harness
        from .summary import progress_line
        short = dict(report.user_properties).get(SHORT_KEY)
        if short is not None and report.failed:
            report.longrepr, report.sections = ShortReport(short), []
        seconds = self.run.test_seconds
        seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
        if getattr(report, "node", None) is not None:     # from a pytest-xdist worker
            self._hypothesis_statistics_to_junit(report)
        payload = dict(report.user_properties).get(STATS_KEY)
        if payload is None and report.failed and getattr(report, "node", None) is not None:
            payload = _adopt_hang_record(report.nodeid)
        if payload is None:
            return
        data = json.loads(payload)
        if getattr(report, "node", None) is not None:     # from a pytest-xdist worker
            harness.merge_stats_json(data)
        name, st = next(iter(data.items()))
        terminal = self.run.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            if getattr(terminal, "_width_of_current_line", 0):   # after xdist's dots
                terminal.write("\n")
            terminal.write_line(f"gdn-verify: {progress_line(name, st)}")

    def _hypothesis_statistics_to_junit(self, report) -> None:
        """A worker's test statistics into the JUnit report, as Hypothesis's
        plugin puts them there in a serial run: its plugin adds them only in
        the process that writes the report, and under pytest-xdist that is
        the controller, which gets them in the test's teardown report."""
        from _hypothesis_pytestplugin import STATS_KEY as HYPOTHESIS_STATS_KEY
        from _pytest.junitxml import xml_key
        stats = report.__dict__.get(HYPOTHESIS_STATS_KEY)
        xml = self.run.config.stash.get(xml_key, None)
        if stats and xml is not None:
            xml.add_global_property("hypothesis-statistics-" + report.nodeid,
                                    base64.b64encode(stats.encode()).decode())

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """pytest-xdist controller: add a finished worker's XLA compiles."""
        output = getattr(node, "workeroutput", {})
        self.run.worker_compiles += int(output.get("gdn_compiles", 0))
        self.run.worker_hits += int(output.get("gdn_cache_hits", 0))

    def pytest_sessionfinish(self, session, exitstatus):
        from .engine import harness
        run = self.run
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:          # a pytest-xdist worker: report to the controller
            workeroutput["gdn_compiles"] = str(run.total_compiles())
            workeroutput["gdn_cache_hits"] = str(run.cache_hits())
            return
        path = report_path(run.config)
        if path:
            with open(path, "w") as f:
                json.dump({"exitstatus": int(exitstatus), "target": run.target.spec,
                           "shard": run.config.getoption("--gdn-shard") or "1/1",
                           "profile": run.profile_name(),
                           "properties": harness.stats_json(),
                           "compiles": run.total_compiles(),
                           "cache_hits": run.cache_hits(),
                           "test_seconds": run.test_seconds}, f)
            from .engine import picture
            with open(path) as f:
                picture.write(json.load(f), picture.beside(path))


class Summary:
    """The summary section (verification/summary.py), the last block the
    run prints: written at unconfigure, after pytest's own short summary
    and its count of passed and failed tests."""

    def __init__(self, run: SuiteRun):
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self, config):
        from .summary import summary_lines
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if (not self.run.session.stats or terminal is None
                or getattr(config, "workerinput", None) is not None):
            return
        terminal.section("gdn-verify summary")
        for line in summary_lines(self.run):
            terminal.write_line(line)


def _diagnosis(prop: str, target, case):
    """The diagnosis (verification/engine/diagnosis.py) of a shrunk failing
    case, as JSON; None in a profile that does not shrink (kill), where a
    run stops at its first failure."""
    from hypothesis import Phase, settings
    from .engine import diagnosis, harness
    if Phase.shrink not in settings().phases:
        return None
    kept = dict(harness.session().last_failure)     # the changed cases' failures stay out
    try:
        return diagnosis.diagnose(
            lambda c: harness.check_property(prop, target, c, record=False), case).to_json()
    finally:
        harness.session().last_failure.clear()
        harness.session().last_failure.update(kept)


def _shorten(report, prop: str, written) -> None:
    """A failed property's report as the terminal shows it, carried in the
    report (SHORT_KEY) to where it is printed: one line per failure class
    (the shrunk case's ratio, the worst seen, its worst row's note, its
    cause, the replay command) and the file that holds the rest: the
    failures' error tables, their tracebacks through the suite and the
    captured output (counterexamples.write_detail). Only the property's own
    failures are shortened; an error of the suite itself keeps its
    traceback."""
    from .engine import counterexamples
    from .summary import ratio_text, shown_path
    st = session_stats().get(prop)
    detail = "\n\n".join([f"--- {title} ---\n{text}" for title, text in report.sections]
                         + [f"--- the failure as raised ---\n{report.longreprtext}"])
    path = shown_path(counterexamples.write_detail(prop, detail))
    lines = [f"{prop}: FAILED, {len(written)} failure class(es); the whole report: {path}"]
    for klass, shrunk, note, file in written:
        row = st.classes.get(klass, {}) if st is not None else {}
        cause = (row.get("diagnosis") or {}).get("cause")
        lines.append(f"  [{klass}] shrunk case ratio {ratio_text(shrunk)} (worst seen "
                     f"{ratio_text(row.get('worst'))})" + (f", {note}" if note else "")
                     + (f"; {cause}" if cause else "")
                     + f": {counterexamples.replay_command(file)}")
    report.user_properties.append((SHORT_KEY, "\n".join(lines)))


# The terminal's text of a failed property (_shorten), carried in the test's
# report to the process that prints it (a pytest-xdist controller).
SHORT_KEY = "gdn_short_report"


class ShortReport:
    """A failed property's report as the terminal shows it (_shorten's
    lines): put in place of the report's traceback where the report is
    printed (Recording.pytest_runtest_logreport), so pytest's short summary
    takes its first line alone, even on CI, where pytest prints a message
    whole."""

    def __init__(self, text: str):
        self.text = text
        self.reprcrash = type("Crash", (), {"message": text.splitlines()[0]})()

    def toterminal(self, tw) -> None:
        for line in self.text.splitlines():
            tw.line(line)

    def __str__(self) -> str:
        return self.text


def session_stats() -> dict:
    """This process's property statistics (the harness's session)."""
    from .engine import harness
    return harness.session().stats


def _adopt_hang_record(nodeid: str):
    """The statistics a pytest-xdist worker left when the watchdog ended it
    in this test (engine/watchdog.py), as a stats payload; None if none."""
    from .engine import watchdog
    folder = os.environ.get(watchdog.RECORDS_ENV)
    if not folder or not os.path.isdir(folder):
        return None
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        with open(path) as f:
            record = json.load(f)
        if record["nodeid"] == nodeid:
            os.remove(path)
            return json.dumps(record["stats"])
    return None


def _keep(config, items, keep):
    """Deselect every item not in keep (order kept)."""
    keep_ids = {id(item) for item in keep}
    drop = [item for item in items if id(item) not in keep_ids]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = [item for item in items if id(item) in keep_ids]


def selected_ids(option: str):
    """The property ids of a --gdn-properties value (UsageError if unknown)."""
    from .engine import registry
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
    from .engine import harness
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
