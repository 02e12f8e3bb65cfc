"""The pytest plugin of the suite (loaded by the repo's conftest.py and by
`gdn-verify`): --gdn-target, the header, counterexample files, and the
per-property summary table."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import settings

from . import counterexamples, harness, runners
from .profiles import register_profiles, selected_profile
from .targets import ENV_VAR as TARGET_ENV
from .targets import Target

register_profiles()
settings.load_profile(selected_profile())

_START = {"t": time.perf_counter(), "compiles": 0}


def pytest_addoption(parser):
    group = parser.getgroup("gdn-verify")
    group.addoption("--gdn-target", default=None,
                    help=f"MODULE[:IMPL] under test (env {TARGET_ENV}; default "
                         "gdn_kernels:pallas, or gdn_kernels:xla without Pallas)")


def pytest_configure(config):
    spec = config.getoption("--gdn-target", default=None)
    if spec:
        os.environ[TARGET_ENV] = spec
    _START["t"], _START["compiles"] = time.perf_counter(), runners.compile_count()


def _profile_name() -> str:
    return settings._current_profile or selected_profile()


def pytest_report_header(config):
    s = settings()
    return [f"gdn-verify: target={Target.parse().spec} profile={_profile_name()} "
            f"max_examples={s.max_examples} derandomize={s.derandomize}"]


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


def summary_lines():
    lines = []
    head = f"{'property':<34}{'examples':>9}{'fail':>5}{'compiles':>9}{'time s':>8}  worst tensor (error/bound)"
    lines.append(head)
    lines.append("-" * (len(head) + 10))
    total_ex = 0
    for name in sorted(harness.STATS):
        st = harness.STATS[name]
        total_ex += st.examples
        worst = sorted(st.worst.values(), key=lambda r: -r.ratio)[:1]
        w = (f"{worst[0].name}: rel {worst[0].rel_l2:.2e} / {worst[0].bound_rel:.1e}, "
             f"ratio {worst[0].ratio:.2f}") if worst and worst[0].bound_rel else \
            ("all exact/structural checks" if worst else "-")
        lines.append(f"{name:<34}{st.examples:>9}{st.failures:>5}{st.compiles:>9}"
                     f"{st.seconds:>8.1f}  {w}")
    lines.append(f"total: {total_ex} examples, {runners.compile_count() - _START['compiles']} "
                 f"XLA compiles, {time.perf_counter() - _START['t']:.0f} s; "
                 f"target {Target.parse().spec}, profile {_profile_name()}")
    return lines


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("GDN_STATS_FILE")
    if path:
        import json
        with open(path, "w") as f:
            json.dump({"exitstatus": int(exitstatus), "properties": harness.stats_json(),
                       "compiles": runners.compile_count() - _START["compiles"]}, f)


def pytest_terminal_summary(terminalreporter):
    if not harness.STATS:
        return
    terminalreporter.section("gdn-verify summary")
    for line in summary_lines():
        terminalreporter.write_line(line)
