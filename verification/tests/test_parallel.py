"""Parallel gating: the suite under pytest-xdist and split into shards
gives a serial run's verdicts and summary, and the reports merge into one.

The subprocess tests run the same properties on a wrong target,
derandomized: once serially, once with `-n 2` (workers report their
per-property statistics to the controller: one table of examples,
failures and compiles; both workers share one compile cache), and as three
`--gdn-shard I/3` runs whose reports `gdn-verify merge-reports` joins.
"""

import json
import os
import subprocess
import sys

import pytest

from verification.engine import reports, shards
from verification.mutants import MUTANTS
from verification.plugin import long_running

WRONG = "verification.fixture_kernels.wrong_targets.nondeterministic"
# determinism fails on this target; the others pass (four tests: no shard of three is empty)
PROPERTIES = "determinism,causality,batch_independence,split_invariance"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, name, extra, profile="ci", properties=PROPERTIES):
    """One pytest process on the wrong target; (process, its stats report).
    The dev profile gets a database of its own; the ci profile has none
    (derandomized: the failing property's shrink path, and so its example
    count, is the same from run to run)."""
    stats = tmp_path / f"{name}.json"
    env = dict(os.environ, GDN_PROFILE=profile, GDN_CI_EXAMPLES="4", GDN_STATS_FILE=str(stats),
               GDN_COUNTEREXAMPLES=str(tmp_path / "counterexamples"),
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.pop("GDN_HYPOTHESIS_DB", None)
    if profile == "dev":
        env["GDN_HYPOTHESIS_DB"] = str(tmp_path / f"{name}-examples")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "gdn_verify", "-q",
         "-p", "no:cacheprovider", "verification/tests/test_properties.py",
         "--gdn-target", WRONG, "--gdn-properties", properties, *extra],
        env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    return proc, json.loads(stats.read_text())


def _verdicts(stats: dict) -> dict:
    return {name: (d["failures"] > 0, d["examples"]) for name, d in stats["properties"].items()}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The serial ci-profile run (derandomized: the same examples every run)."""
    return _run(tmp_path_factory.mktemp("serial"), "serial", [])


@long_running
def test_parallel_dev_profile_gives_the_serial_verdicts(tmp_path):
    """The dev profile draws random examples (two properties: its examples
    are larger and it shrinks further): verdicts and summary rows agree."""
    pytest.importorskip("xdist")
    two = "determinism,causality"
    s_proc, s_stats = _run(tmp_path, "serial-dev", [], profile="dev", properties=two)
    p_proc, p_stats = _run(tmp_path, "parallel-dev", ["-n", "2"], profile="dev", properties=two)
    assert s_proc.returncode == p_proc.returncode == 1, p_proc.stdout[-2000:]
    verdict = {n: d["failures"] > 0 for n, d in s_stats["properties"].items()}
    assert verdict == {n: d["failures"] > 0 for n, d in p_stats["properties"].items()}
    assert verdict == {"determinism": True, "causality": False}
    summary = p_proc.stdout.split("gdn-verify summary")[1]
    assert all(name in summary for name in two.split(","))


def test_parallel_run_matches_serial_verdicts_and_summary(serial, tmp_path):
    """The ci profile: verdicts and example counts agree exactly."""
    pytest.importorskip("xdist")
    s_proc, s_stats = serial
    p_proc, p_stats = _run(tmp_path, "parallel", ["-n", "2"])
    assert s_proc.returncode == p_proc.returncode == 1, (s_proc.stdout[-2000:],
                                                          p_proc.stdout[-2000:])
    assert _verdicts(s_stats) == _verdicts(p_stats)
    assert p_stats["compiles"] > 0                   # the workers' compiles reach the controller
    summary = p_proc.stdout.split("gdn-verify summary")[1]
    for name in PROPERTIES.split(","):
        assert name in summary
    files = [f for f in os.listdir(tmp_path / "counterexamples") if f.endswith(".json")]
    assert files and all(f.startswith("determinism-") for f in files)
    assert os.path.exists(tmp_path / "counterexamples" / "determinism.failure.txt")


def test_shard_reports_merge_to_the_unsharded_verdicts(serial, tmp_path):
    s_proc, s_stats = serial
    shards = [_run(tmp_path, f"shard{i}", ["--gdn-shard", f"{i}/3"]) for i in (1, 2, 3)]
    ran = [set(stats["properties"]) for _, stats in shards]
    assert all(ran) and sum(map(len, ran)) == len(set().union(*ran)) == 4   # a partition
    merged = reports.merge([str(tmp_path / f"shard{i}.json") for i in (1, 2, 3)])
    assert _verdicts(merged) == _verdicts(s_stats)
    assert merged["exitstatus"] == s_proc.returncode == 1
    text = reports.markdown(merged)
    assert text.splitlines()[-1].startswith("FAIL: 3 shard(s)") and "determinism" in text


def test_bad_shard_option_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "gdn_verify", "-q",
                           "-p", "no:cacheprovider", "--collect-only",
                           "verification/tests/test_tolerance.py", "--gdn-shard", "4/3"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 4 and "--gdn-shard" in proc.stderr + proc.stdout


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", ""])
def test_parse_shard_rejects_what_is_not_i_of_n(text):
    with pytest.raises(ValueError, match="shard"):
        shards.parse_shard(text)


def test_shards_of_a_list_partition_it_in_order():
    items = list(range(10))
    parts = [shards.shard_of(items, (i, 3)) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == items and parts[0] == [0, 3, 6, 9]
    assert shards.shard_of(items, None) == items


def test_projected_wall_is_longest_first_onto_the_least_loaded_core():
    jobs = [4.0, 3.0, 3.0, 2.0, 2.0]
    assert shards.projected_wall(jobs, 1) == sum(jobs)
    assert shards.projected_wall(jobs, 2) == 8.0          # 4+2+2 | 3+3: LPT, not the optimum 7
    assert shards.projected_wall(jobs, 16) == max(jobs)
    assert "4 cores" in shards.projection_line(jobs, "x")


def _mutant_record(name, impl, killed):
    return {"mutant": name, "impl": impl, "description": "", "killed": killed,
            "killed_by": "p" if killed else None, "examples_to_kill": 2 if killed else None,
            "status": "killed" if killed else "survived", "wall_s": 1.0, "subset": "-"}


def test_mutation_shards_merge_in_catalog_order_with_one_kill_rate(tmp_path):
    names = list(MUTANTS)[:3]
    records = [_mutant_record(n, impl, killed=(k != 1)) for k, n in enumerate(names)
               for impl in MUTANTS[n].impls]
    paths = []
    for i, part in enumerate((records[::2], records[1::2])):
        path = tmp_path / f"m{i}.json"
        path.write_text(json.dumps({"mutants": part[::-1], "baseline": {"passed": True},
                                    "wall_s": 5.0 + i}))
        paths.append(str(path))
    merged = reports.merge(paths)
    # the unsharded run's order: catalog order, each mutant's impls as declared
    assert [(m["mutant"], m["impl"]) for m in merged["mutants"]] == [
        (r["mutant"], r["impl"]) for r in records]
    killed = sum(r["killed"] for r in records)
    assert merged["summary"].startswith(f"kill rate: {killed}/{len(records)}")
    assert not merged["passed"]
    assert reports.markdown(merged).splitlines()[-1].startswith("FAIL: 2 shard(s)")


def test_merge_reports_command_writes_into_a_new_folder(tmp_path, capsys):
    from verification.cli import main
    record = _mutant_record(next(iter(MUTANTS)), "xla", killed=True)
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"mutants": [record], "baseline": {"passed": True},
                                "wall_s": 1.0}))
    out = tmp_path / "merged" / "here"
    assert main(["merge-reports", str(path), "--report-dir", str(out)]) == 0
    assert json.loads((out / "merged-report.json").read_text())["passed"]
    assert "kill rate: 1/1" in (out / "merged-report.md").read_text()


def _suite_report(path, shard, failures=0):
    path.write_text(json.dumps({"exitstatus": 0, "shard": shard, "compiles": 1,
                                "properties": {f"p{shard[0]}": {
                                    "examples": 2, "failures": failures,
                                    "first_failure_at": 0, "seconds": 1.0, "compiles": 1,
                                    "not_checkable": 0, "worst": []}}}))
    return str(path)


def test_merge_fails_when_a_shards_report_is_missing(tmp_path):
    one, three = (_suite_report(tmp_path / f"s{i}.json", f"{i}/3") for i in (1, 3))
    merged = reports.merge([one, three])
    assert not merged["passed"] and merged["missing"] == ["shard 2/3 missing"]
    assert "FAIL: shard 2/3 missing" in reports.markdown(merged)
    two = _suite_report(tmp_path / "s2.json", "2/3")
    assert reports.merge([one, two, three])["passed"]
    assert not reports.merge([one, two, three, one])["passed"]           # given twice
    other = _suite_report(tmp_path / "o.json", "1/2")
    assert "differently split" in reports.merge([one, other])["missing"][0]


def test_the_load_of_the_gate_under_load_stops_by_itself():
    """gate/busy_core.py, the one-core load gate/ci-under-load.sh runs the
    gate under: a single thread that ends by itself after its limit."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "gate", "busy_core.py"), "0.2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
