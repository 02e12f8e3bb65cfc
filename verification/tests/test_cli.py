"""The command line a user expects: options before or after the command
(or rejected loudly), `list`, `--seed`, JUnit XML and the JSON report, and
counterexamples that replay under the settings they were found under."""

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from ..engine import counterexamples
from ..cli import _suite_args, main, parse
from ..mutants import MUTANTS
from ..engine.registry import PROPERTIES
from ..properties import load_all

load_all()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCAN = "verification.fixture_kernels.foreign_targets.float32_only_scan"


@pytest.mark.parametrize("argv", [
    ["--target", "m:x", "--profile", "ci", "run"],
    ["run", "--target", "m:x", "--profile", "ci"],
    ["--target", "m:x", "run", "--profile", "ci"],
    ["--profile", "ci", "--target", "m:x"],
])
def test_options_before_or_after_the_command(argv):
    args, extra = parse(argv)
    assert (args["command"], args["target"], args["profile"], extra) == ("run", "m:x", "ci", [])


@pytest.mark.parametrize("argv, option", [
    (["--profile", "ci", "mutants"], "--profile"),
    (["mutants", "--target", "m"], "--target"),
    (["list", "--strict"], "--strict"),
    (["replay", "f.json", "--seed", "3"], "--seed"),
    (["merge-reports", "a.json", "--", "-x"], "pytest arguments"),
])
def test_an_option_the_command_does_not_take_is_an_error(argv, option, capsys):
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2 and option in capsys.readouterr().err


def test_run_options_become_pytest_options():
    args, _ = parse(["--target", "m", "--seed", "7", "--examples", "3", "--strict",
                     "--properties", "determinism", "--junit-xml", "r.xml",
                     "--known-failures", "k.txt", "--scope", "all"])
    out = _suite_args(args)
    for option in ("--gdn-target=m", "--hypothesis-seed=7", "--gdn-examples=3",
                   "--gdn-properties=determinism", "--junitxml=r.xml",
                   "--gdn-known-failures=k.txt", "--gdn-scope=all", "--gdn-strict"):
        assert option in out, (option, out)
    assert "--gdn-scope=properties" in _suite_args(parse(["run"])[0])


def test_jobs_default_to_every_core_or_xdists_auto_count(monkeypatch):
    """`gdn-verify` on every core, or as many workers as pytest -n auto would
    start (PYTEST_XDIST_AUTO_NUM_WORKERS); --jobs wins."""
    from ..cli import AUTO_JOBS_ENV

    def workers(argv):
        out = _suite_args(parse(argv)[0])
        return int(out[out.index("-n") + 1]) if "-n" in out else 1

    monkeypatch.delenv(AUTO_JOBS_ENV, raising=False)
    assert workers(["run"]) == (os.cpu_count() or 1)
    monkeypatch.setenv(AUTO_JOBS_ENV, "1")
    assert workers(["run"]) == 1
    monkeypatch.setenv(AUTO_JOBS_ENV, "3")
    assert workers(["run"]) == 3 and workers(["run", "--jobs", "2"]) == 2


def test_list_names_every_property_and_mutant(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert f"properties ({len(PROPERTIES)})" in text and f"mutants ({len(MUTANTS)})" in text
    assert all(p in text for p in PROPERTIES) and all(m in text for m in MUTANTS)
    assert "needs: sharded" in text


def test_junit_xml_json_report_and_seed(tmp_path):
    junit, report = tmp_path / "r.xml", tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "verification.cli", "--target", SCAN, "--seed", "5",
         "--examples", "2", "--properties", "delta_rule_forward_parity,split_invariance",
         "--junit-xml", str(junit), "--json", str(report), "--jobs", "1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # no warning of pytest's about the command's own import of the suite
    assert "PytestAssertRewriteWarning" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    assert {c.get("name") for c in cases} == {"test_delta_rule_forward_parity",
                                              "test_split_invariance"}
    data = json.loads(report.read_text())
    assert data["target"] == SCAN and data["exitstatus"] == 0
    assert {n: d["verdict"] for n, d in data["properties"].items()} == {
        "delta_rule_forward_parity": "held", "split_invariance": "held"}


def test_the_json_report_is_a_pytest_option_and_the_variable_its_alias(tmp_path):
    """pytest --gdn-report=FILE writes the report (a relative path from where
    pytest was started), and its picture beside it; GDN_STATS_FILE still
    does, when no option is given."""
    for how in ("option", "variable"):
        report = tmp_path / f"{how}.json"
        env = {k: v for k, v in os.environ.items() if k != "GDN_STATS_FILE"}
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--gdn-target", SCAN, "--gdn-properties", "determinism", "--gdn-examples", "1"]
        if how == "option":
            args.append(f"--gdn-report={os.path.relpath(report, ROOT)}")
        else:
            env["GDN_STATS_FILE"] = str(report)
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        data = json.loads(report.read_text())
        assert data["target"] == SCAN and data["properties"]["determinism"]["verdict"] == "held"
        picture = report.with_suffix(".svg").read_text()      # the run's picture beside it
        assert "determinism" in picture and picture.startswith("<svg")


@pytest.mark.parametrize("ci, profile", [("true", "ci"), (None, "dev")])
def test_ci_set_and_no_profile_named_loads_the_ci_profile(ci, profile):
    """As Hypothesis itself loads its "ci" profile where CI is set, a run
    that names no profile loads the suite's derandomized ci profile there."""
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_PROFILE", "CI")}
    if ci:
        env["CI"] = ci
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--gdn-target", SCAN, "--gdn-properties", "determinism",
                           "--gdn-examples", "1"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"profile={profile} " in proc.stdout, proc.stdout[:2000]
    assert f"derandomize={profile == 'ci'}" in proc.stdout, proc.stdout[:2000]


@pytest.mark.parametrize("workers", [None, "2"])
def test_property_tests_are_hypothesis_tests_to_its_plugin(tmp_path, workers):
    """The properties' tests are Hypothesis tests to Hypothesis's pytest
    plugin: `-m hypothesis` selects them, `--hypothesis-show-statistics`
    prints each one's statistics with the strategies' events, and the JUnit
    report carries them, in a serial run and under pytest-xdist (whose
    workers' statistics Hypothesis's plugin leaves out of it). A progress
    line comes while each property runs: on the terminal, or from an xdist
    worker on standard error, named by the worker. CI set: the ci profile
    (no example database: every example is drawn)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_PROFILE", "CI")}
    env["CI"] = "true"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--gdn-target", SCAN, "--gdn-properties", "determinism,causality",
                           "--gdn-examples", "2", "-m", "hypothesis", "--gdn-progress-every=0",
                           "--hypothesis-show-statistics", f"--junit-xml={junit}",
                           *(["-n", workers] if workers else [])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
    stats = proc.stdout.split("Hypothesis Statistics", 1)[1]
    progress = proc.stderr if workers else proc.stdout
    by_worker = r" \[gw\d\]" if workers else ""
    for prop in ("determinism", "causality"):
        section = stats.split(f"test_properties.py::test_{prop}:", 1)[1].split("::test_", 1)[0]
        assert "Events:" in section and "dtypes " in section, stats[:3000]
        line = rf"gdn-verify{by_worker}: {prop}: running, 1 example\(s\) done"
        assert re.search(line, progress), progress[-3000:]
    names = {p.get("name") for p in ElementTree.parse(junit).iter("property")}
    for prop in ("determinism", "causality"):
        assert any(n.endswith(f"test_properties.py::test_{prop}") for n in names), names


@pytest.mark.parametrize("option, suffix", [("--hypothesis-verbosity=verbose",
                                             "-with-verbose-verbosity"),
                                            ("--hypothesis-explain", "-with-explain-phase")])
def test_hypothesis_options_keep_the_profiles_covering(option, suffix):
    """Hypothesis's pytest plugin loads a renamed copy of the profile for
    these options; the lattice still draws that profile's covering."""
    from hypothesis import settings
    from strategies import lattice
    before = settings.get_current_profile_name()
    for name, covering in lattice.PROFILE_COVERING.items():
        copy = name + suffix
        settings.register_profile(copy, settings.get_profile(name))
        settings.load_profile(copy)
        try:
            assert lattice.current_covering() == covering, (option, copy)
        finally:
            settings.load_profile(before)


def test_version_names_gdn_verify_and_what_decides_its_runs():
    proc = subprocess.run([sys.executable, "-m", "verification.cli", "--version"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[0] == "gdn-verify" and words[1][0].isdigit(), proc.stdout
    for dep in ("jax", "jaxlib", "hypothesis", "pytest"):
        assert f"{dep} " in proc.stdout, proc.stdout


# --------------------------------------------------------------- replay
PROBE = '''
import os
from verification.fixture_kernels.foreign_targets.float32_only_scan import *   # noqa: F401,F403
from verification.fixture_kernels.foreign_targets import float32_only_scan as _scan

def gated_delta_rule(*args, **kwargs):
    with open(os.environ["PROBE_FILE"], "a") as f:
        f.write(os.environ.get("XLA_FLAGS", "") + "|" + os.environ.get("GDN_INTERPRET", "") + "\\n")
    return _scan.gated_delta_rule(*args, **kwargs)
'''


def test_replay_restores_the_recorded_interpret_mode_and_xla_flags(tmp_path):
    """A file found under other settings replays under them: the target
    sees the recorded XLA_FLAGS and interpret mode, not the caller's."""
    (tmp_path / "probe_target.py").write_text(PROBE)
    prop = PROPERTIES["delta_rule_forward_parity"]
    case = prop.examples[0] if prop.examples else None
    if case is None:
        from hypothesis import HealthCheck, given, settings

        found = []

        @settings(max_examples=1, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=prop.strategy)
        def draw(c):
            found.append(c)
        draw()
        case = found[0]
    path = counterexamples.write(prop.id, case, "probe_target", "dev", [], "(none)",
                                 folder=str(tmp_path / "ce"))
    record = json.loads(open(path).read())
    record["environment"]["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=false"
    record["interpret_mode"] = "tpu-sim"
    with open(path, "w") as f:
        json.dump(record, f)
    probe = tmp_path / "probe.txt"
    env = dict(os.environ, PROBE_FILE=str(probe), XLA_FLAGS="--xla_dump_to=/nonexistent",
               GDN_INTERPRET="hlo")
    proc = subprocess.run([sys.executable, "-m", "verification.cli", "replay", path],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "interpret mode tpu-sim" in proc.stdout
    seen = set(probe.read_text().splitlines())
    assert seen == {"--xla_cpu_enable_fast_math=false|tpu-sim"}, seen


def test_replay_warns_what_it_cannot_restore(tmp_path, capsys, monkeypatch):
    """In a process whose XLA already started, the recorded flags cannot
    apply: the replay says so instead of pretending."""
    import jax
    for name in counterexamples.RECORDED_ENV:     # this process's settings come back after
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    jax.numpy.zeros(1).block_until_ready()
    prop = PROPERTIES["split_invariance"]
    from strategies.cases import DeltaRuleCase
    case = DeltaRuleCase(batch=1, seq_len=3, k_heads=1, group=1, dk=16, dv=16, chunk=16,
                         dtype="float32", state_dtype="float32", seed=1)
    path = counterexamples.write(prop.id, case, SCAN, "dev", [], "(none)",
                                 folder=str(tmp_path))
    record = json.loads(open(path).read())
    record["environment"]["XLA_FLAGS"] = "--some_other_flags"
    record["versions"]["jax"] = "0.0.1"
    with open(path, "w") as f:
        json.dump(record, f)
    assert main(["replay", path]) == 0
    err = capsys.readouterr().err
    assert "cannot restore XLA_FLAGS" in err and "recorded under jax 0.0.1" in err


class _Terminal:
    def __init__(self):
        self.lines = []

    def write(self, text):
        pass

    def write_line(self, text):
        self.lines.append(text)


class _Plugins:
    def __init__(self, terminal):
        self.terminal = terminal

    def get_plugin(self, name):
        return self.terminal if name == "terminalreporter" else None


def test_a_long_property_prints_a_progress_line_every_so_often():
    """While a property runs, a line of examples done of planned comes every
    Progress.PROGRESS_EVERY_S seconds of it, none sooner."""
    from ..plugin import Progress
    from ..engine.harness import PropertyStats
    terminal = _Terminal()
    clock = [100.0]
    progress = Progress(type("Config", (), {"pluginmanager": _Plugins(terminal)})(),
                        clock=lambda: clock[0])
    stats = PropertyStats()
    for step in range(1, 8):                 # an example every 4 s
        clock[0] += 4.0
        stats.examples, stats.seconds = step, 4.0 * step
        progress.line("mixer_split_invariance", stats, planned=7)
    assert terminal.lines == [
        "gdn-verify: mixer_split_invariance: running, 3 example(s) done of 7 planned [12 s]",
        "gdn-verify: mixer_split_invariance: running, 6 example(s) done of 7 planned [24 s]"]


def test_progress_says_a_failing_property_is_searching_and_shrinking():
    """Once an example has failed, the progress line says so: Hypothesis is
    shrinking, and the planned count no longer bounds the examples run."""
    from ..plugin import Progress
    from ..engine.harness import PropertyStats
    terminal = _Terminal()
    clock = [100.0]
    progress = Progress(type("Config", (), {"pluginmanager": _Plugins(terminal)})(),
                        clock=lambda: clock[0])
    stats = PropertyStats(examples=65, failures=12, first_failure_at=4, seconds=30.0)
    clock[0] += 30.0
    progress.line("state_gradient_parity", stats, planned=10)
    assert terminal.lines == [
        "gdn-verify: state_gradient_parity: failing since example 4, searching and shrinking: "
        "65 example(s) run, 12 failing [30 s]"]



ABORTS_AT_TEARDOWN = "verification.fixture_kernels.foreign_targets.aborts_at_teardown"


def test_the_exit_status_is_the_verdicts_whatever_tears_down_after_it():
    """A kernel module whose runtime aborts the process at interpreter
    teardown (as an MLX function compiled with mx.compile can): gdn-verify's
    status is still the verdict's (0: the kernel is correct). The control:
    the same run through main() alone, the interpreter then tearing down,
    ends by SIGABRT."""
    args = ["--target", ABORTS_AT_TEARDOWN, "--profile", "dev", "--examples", "2",
            "--properties", "causality", "--jobs", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDN_")}
    proc = subprocess.run([sys.executable, "-m", "verification.cli", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "FAILED: 0" in proc.stdout
    control = subprocess.run(
        [sys.executable, "-c", "import sys; from verification.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert control.returncode == -6, control.returncode           # SIGABRT
