"""The pytest plugin of the suite (loaded by the repo's conftest.py and by
`gdn-verify`): --gdn-target, --gdn-properties (select properties by id),
the header, counterexample files, and the per-property summary table."""

from __future__ import annotations

import os
import time

from . import compile_settings

# before this process's first XLA computation (see compile_settings)
COMPILE_SETTINGS = compile_settings.apply()

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from . import counterexamples, harness, registry, reports, runners  # noqa: E402
from .profiles import register_profiles, selected_profile
from .targets import ENV_VAR as TARGET_ENV
from .targets import Target
from .tolerance import NEAR_ZERO

register_profiles()
settings.load_profile(selected_profile())

_START = {"t": time.perf_counter(), "compiles": 0}
# XLA compiles reported by pytest-xdist workers (the controller runs no check).
_WORKERS = {"compiles": 0}
# Seconds of every test (setup + call + teardown) by node id; under xdist the
# controller receives each worker's reports, so this covers the whole run.
TEST_SECONDS: dict = {}


def pytest_addoption(parser):
    group = parser.getgroup("gdn-verify")
    group.addoption("--gdn-target", default=None,
                    help=f"MODULE[:IMPL] under test (env {TARGET_ENV}; default "
                         "gdn_kernels:pallas)")
    group.addoption("--gdn-properties", default=None, metavar="ID[,ID...]",
                    help="run only these registered properties (by id; 'all' = every "
                         f"property, no other test; '{registry.SHARDED_SUBSET}' = those "
                         "declared on_sharded_target)")
    group.addoption("--gdn-shard", default=None, metavar="I/N",
                    help="run only shard I of N (1-based) of the selected tests: a stable "
                         "split by test id, for CI jobs whose reports `gdn-verify "
                         "merge-reports` joins")


def pytest_configure(config):
    spec = config.getoption("--gdn-target", default=None)
    if spec:
        os.environ[TARGET_ENV] = spec
    _START["t"], _START["compiles"] = time.perf_counter(), runners.compile_count()
    config.addinivalue_line("markers", f"{harness.MARKER}(id): the test of registered "
                                       "property <id> (verification/registry.py)")


def selected_ids(option: str):
    """The property ids of a --gdn-properties value (UsageError if unknown)."""
    ids = [i.strip() for i in option.split(",") if i.strip()]
    every = registry.load_all()
    if ids == ["all"]:
        return list(every)
    if ids == [registry.SHARDED_SUBSET]:
        return [p.id for p in every.values() if p.on_sharded_target]
    try:
        return [p.id for p in registry.select(ids)]
    except ValueError as err:
        raise pytest.UsageError(f"--gdn-properties: {err}") from None


def _keep(config, items, keep):
    """Deselect every item not in keep (order kept)."""
    drop = [item for item in items if item not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = [item for item in items if item in keep]


def pytest_collection_modifyitems(config, items):
    _select_properties(config, items)
    shard = config.getoption("--gdn-shard", default=None)
    if shard:
        try:
            i, n = reports.parse_shard(shard)
        except ValueError as err:
            raise pytest.UsageError(f"--gdn-shard: {err}") from None
        mine = set(reports.shard_of(sorted(item.nodeid for item in items), (i, n)))
        _keep(config, items, [item for item in items if item.nodeid in mine])


def _select_properties(config, items):
    option = config.getoption("--gdn-properties", default=None)
    if not option:
        return
    wanted = set(selected_ids(option))
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker(harness.MARKER)
        (keep if mark is not None and mark.args[0] in wanted else drop).append(item)
    missing = wanted - {i.get_closest_marker(harness.MARKER).args[0] for i in keep}
    if missing:
        raise pytest.UsageError(f"--gdn-properties: no test collected for {sorted(missing)}")
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _profile_name() -> str:
    return settings._current_profile or selected_profile()


def pytest_report_header(config):
    s = settings()
    return [f"gdn-verify: target={Target.parse().spec} profile={_profile_name()} "
            f"max_examples={s.max_examples} derandomize={s.derandomize}",
            f"gdn-verify: {COMPILE_SETTINGS}"]


@pytest.fixture(scope="session")
def gdn_target() -> Target:
    """The implementation under test (--gdn-target / GDN_TARGET)."""
    return Target.parse()


def pytest_runtest_setup(item):
    harness.LAST_FAILURE.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for prop, (case, target, rows) in list(harness.LAST_FAILURE.items()):
        from .tolerance import format_table
        table = format_table(rows) if rows else "(no error table: the check raised)"
        path = counterexamples.write(prop, case, target.spec, _profile_name(), rows, table)
        report.sections.append(("gdn-verify counterexample",
                                f"shrunk case written to {path}\nreplay: "
                                f"{counterexamples.replay_command(path)}\n{table}"))
    harness.LAST_FAILURE.clear()


def _worst_text(row) -> str:
    """The worst row as the verdict judged it: relative and absolute error,
    or the absolute error alone for a row judged by the near-zero floor."""
    if not row.bound_rel and not row.bound_abs:
        return "all exact/structural checks"
    if row.note == NEAR_ZERO:
        measure = f"abs {row.max_abs:.2e} / {row.bound_abs:.1e} (near-zero)"
    else:
        measure = f"rel {row.rel_l2:.2e} / {row.bound_rel:.1e}"
    return f"{row.name}: {measure}, ratio {row.ratio:.2f}"


def summary_lines():
    lines = []
    head = (f"{'property':<42}{'examples':>9}{'fail':>5}{'compiles':>9}{'compile s':>10}"
            f"{'time s':>8}  worst tensor (error/bound)")
    lines.append(head)
    lines.append("-" * (len(head) + 10))
    total_ex = 0
    for name in sorted(harness.STATS):
        st = harness.STATS[name]
        total_ex += st.examples
        worst = sorted(st.worst.values(), key=lambda r: -r.ratio)[:1]
        w = _worst_text(worst[0]) if worst else "-"
        if st.not_checkable:
            w += f"; {st.not_checkable} example(s) not checkable (see the rows' notes)"
        lines.append(f"{name:<42}{st.examples:>9}{st.failures:>5}{st.compiles:>9}"
                     f"{st.compile_s:>10.1f}{st.seconds:>8.1f}  {w}")
    from .reports import projection_line
    lines.append(projection_line(list(TEST_SECONDS.values()), "test-session"))
    lines.append(f"total: {total_ex} examples, {_compiles_here() + _WORKERS['compiles']} "
                 f"XLA compiles, {time.perf_counter() - _START['t']:.0f} s; "
                 f"target {Target.parse().spec}, profile {_profile_name()}")
    return lines


def _compiles_here() -> int:
    return runners.compile_count() - _START["compiles"]


def pytest_sessionfinish(session, exitstatus):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:          # a pytest-xdist worker: report to the controller
        import json
        workeroutput["gdn_stats"] = json.dumps({"properties": harness.stats_json(),
                                                "compiles": _compiles_here()})
    path = os.environ.get("GDN_STATS_FILE")
    if path and workeroutput is None:     # the controller (or a serial run) writes it
        import json
        with open(path, "w") as f:
            json.dump({"exitstatus": int(exitstatus), "properties": harness.stats_json(),
                       "compiles": _compiles_here() + _WORKERS["compiles"],
                       "test_seconds": TEST_SECONDS}, f)


def pytest_runtest_logreport(report):
    TEST_SECONDS[report.nodeid] = TEST_SECONDS.get(report.nodeid, 0.0) + report.duration


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist controller: merge a finished worker's statistics, so the
    summary is one table over every worker."""
    import json
    payload = getattr(node, "workeroutput", {}).get("gdn_stats")
    if payload:
        data = json.loads(payload)
        harness.merge_stats_json(data["properties"])
        _WORKERS["compiles"] += data["compiles"]


def pytest_terminal_summary(terminalreporter):
    if not harness.STATS:
        return
    terminalreporter.section("gdn-verify summary")
    for line in summary_lines():
        terminalreporter.write_line(line)
