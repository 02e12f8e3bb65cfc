"""The suite under pytest-xdist gives a serial run's verdicts and summary:
the same properties on a wrong target, derandomized, once serially and once
with `-n 2`; the per-property statistics the workers report are merged into
one table (examples, failures, compiles)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("xdist")

WRONG = "verification.wrong_targets.nondeterministic"
PROPERTIES = "determinism,causality"


def _run(tmp_path, name, extra):
    stats = tmp_path / f"{name}.json"
    env = dict(os.environ, GDN_PROFILE="ci", GDN_CI_EXAMPLES="4", GDN_STATS_FILE=str(stats))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "verification.plugin", "-q",
         "-p", "no:cacheprovider", "verification/test_properties.py",
         "--gdn-target", WRONG, "--gdn-properties", PROPERTIES, *extra],
        env=env, capture_output=True, text=True, timeout=1200,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return proc, json.loads(stats.read_text())


def test_parallel_run_matches_serial_verdicts_and_summary(tmp_path):
    serial, s_stats = _run(tmp_path, "serial", [])
    parallel, p_stats = _run(tmp_path, "parallel", ["-n", "2"])
    assert serial.returncode == parallel.returncode != 0, (serial.stdout[-2000:],
                                                           parallel.stdout[-2000:])
    verdict = {n: (d["failures"] > 0) for n, d in s_stats["properties"].items()}
    assert verdict == {n: (d["failures"] > 0) for n, d in p_stats["properties"].items()}
    assert "gdn-verify summary" in parallel.stdout
    for name in PROPERTIES.split(","):
        assert name in parallel.stdout.split("gdn-verify summary")[1]
