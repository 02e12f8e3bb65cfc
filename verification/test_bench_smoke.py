"""Smoke test of the benchmark harness (benchmarks/): the --quick ladder for
xla and reference, one timed run, in a subprocess (its compiles stay out of
this process's counts); checks the JSON and Markdown structure, and that
`gdn-verify bench` forwards to the harness."""

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_ladder_writes_json_and_markdown(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--impls", "xla", "reference",
           "--repeats", "1", "--out", str(tmp_path), "--name", "smoke", "--no-plot"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert wall < 60, f"smoke run took {wall:.0f} s"

    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert set(doc) >= {"meta", "config", "results", "ratios", "fits", "acceptance", "suite"}
    meta = doc["meta"]
    for key in ("jax_version", "device_kind", "platform", "loadavg_start", "loadavg_end"):
        assert key in meta
    assert doc["config"]["impls"] == ["xla", "reference"]
    assert doc["suite"] is None

    results = doc["results"]
    # 2 sizes x 2 ops x 2 modes x 2 impls, all timed
    assert len(results) == 16
    for r in results:
        assert r["status"] == "ok", r
        assert r["repeats"] == 1 and len(r["times_s"]) == 1
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["compile_total_s"] > 0 and r["temp_bytes"] >= 0
    # the chunked impl computes what the oracle computes
    for r in results:
        if r["impl"] == "xla":
            assert r["rel_err_vs_reference"] < 1e-4, r

    assert len(doc["ratios"]) == 8
    for row in doc["ratios"]:
        assert row["xla/reference time"] > 0
        assert row["xla/reference temp memory"] > 0
    fits = {(f["op"], f["impl"], f["mode"]): f for f in doc["fits"]}
    assert len(fits) == 8
    assert all(f["time exponent"] is not None for f in fits.values())
    # the acceptance size is not on the quick ladder: listed, not measured
    assert doc["acceptance"] and all(a["pass"] is None for a in doc["acceptance"])

    md = (tmp_path / "smoke.md").read_text()
    for heading in ("## Time and memory", "## Ratios", "## Growth in T", "## Acceptance"):
        assert heading in md
    assert md.count("| B1-T64-Hk1-Hv2-D16 |") >= 8
    assert not (tmp_path / "smoke.png").exists()


def test_gdn_verify_bench_forwards_to_the_harness(monkeypatch):
    import benchmarks.__main__ as bench_main
    from verification import cli

    seen = []
    monkeypatch.setattr(bench_main, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["bench", "--quick", "--impls", "xla"]) == 0
    assert seen == [["--quick", "--impls", "xla"]]
