"""`gdn-verify mutants`: the seeded-bug kill report.

For each mutant and each impl whose code it breaks, a fresh Python process
runs the suite (ci profile, derandomized) against gdn_mutant_<name>:<impl>
with the persistent compile cache OFF (a stale cache entry must never hide a
mutant), stopping at the first failing test. The declared faster subset:
only the mutant's declared killer properties run first (selected by
property id, --gdn-properties); if none of them fails, the whole suite runs
(and a survivor is reported). A mutant counts as killed only when a
property recorded a failure on it; a mutant whose patch no longer applies,
or whose run errors outside the properties, is reported by name as an
error and fails the gate. The unmutated package is run the same way on the
union of all subsets. Writes mutation-report.json and mutation-report.md;
exits 1 if any mutant survives or errors, or the unmutated package fails.

--jobs N runs N of these processes at once: each is one single-threaded,
compile-bound pytest, so on a 2-core machine two jobs take about half the
wall time. The baseline is split the same way, into N processes (every N-th
property of the union each), so it does not bound the run on a big
machine. The report keeps the catalog's order; its projection counts each
baseline test as its own job.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

from ..registry import load_all, select
from ..reports import shard_of
from . import MUTANTS, PREFIX, PatchError, materialize

SUITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(mutant_dir: str, stats_file: str, compile_cache: bool) -> dict:
    env = dict(os.environ)
    if not compile_cache:
        for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
            env.pop(key, None)
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["GDN_MUTANT_DIR"] = mutant_dir
    env["GDN_STATS_FILE"] = stats_file
    env["GDN_PROFILE"] = "ci"
    env["GDN_COUNTEREXAMPLES"] = os.path.join(mutant_dir, "counterexamples")
    return env


def run_suite_process(target: str, properties: Optional[List[str]], mutant_dir: str,
                      examples: Optional[int], compile_cache: bool = False) -> dict:
    """One fresh pytest process running the given properties (None: every
    registered property) against target; returns its stats plus wall time."""
    stats_file = tempfile.mktemp(suffix=".json", dir=mutant_dir)
    cmd = [sys.executable, "-m", "pytest", SUITE_DIR, "-p", "verification.plugin", "-x", "-q",
           "--hypothesis-profile", "ci", "--gdn-target", target, "-p", "no:cacheprovider",
           "--gdn-properties", ",".join(p.id for p in select(properties)) if properties
           else "all"]
    env = _env(mutant_dir, stats_file, compile_cache)
    if examples:
        env["GDN_CI_EXAMPLES"] = str(examples)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.getcwd())
    wall = time.perf_counter() - t0
    stats = {}
    if os.path.exists(stats_file):
        with open(stats_file) as f:
            stats = json.load(f)
    return {"returncode": proc.returncode, "wall_s": wall, "stats": stats,
            "tail": (proc.stdout + proc.stderr)[-3000:]}


def _killer(stats: dict):
    for name, st in stats.get("properties", {}).items():
        if st["failures"]:
            return name, st["first_failure_at"]
    return None, None


def run_mutant(name: str, impl: str, mutant_dir: str, examples: Optional[int]) -> dict:
    mutant = MUTANTS[name]
    target = f"{PREFIX}{name}:{impl}"
    record = {"mutant": name, "impl": impl, "description": mutant.description,
              "killed": False, "killed_by": None, "examples_to_kill": None}
    try:
        materialize(name)
    except PatchError as err:
        return record | {"status": "patch failed", "wall_s": 0.0, "subset": "-",
                         "log_tail": str(err)}
    result = run_suite_process(target, list(mutant.killers), mutant_dir, examples)
    subset = "declared killers: " + ", ".join(mutant.killers)
    wall = result["wall_s"]
    if result["returncode"] == 0:          # subset missed it: run every property
        result = run_suite_process(target, None, mutant_dir, examples)
        subset = "every property (declared killers missed it)"
        wall += result["wall_s"]
    killer, at = _killer(result["stats"])
    killed = killer is not None and result["returncode"] == 1
    status = "killed" if killed else ("survived" if result["returncode"] == 0 else "error")
    return record | {"status": status, "killed": killed, "killed_by": killer,
                     "examples_to_kill": at, "wall_s": round(wall, 1), "subset": subset,
                     "log_tail": None if killed else result["tail"]}


def markdown(report: dict) -> str:
    lines = ["| mutant | impl | killed | killed by | examples to kill | wall s | what it models |",
             "|---|---|---|---|---|---|---|"]
    for r in report["mutants"]:
        verdict = "yes" if r["killed"] else f"**{r['status'].upper()}**"
        lines.append(f"| {r['mutant']} | {r['impl']} | {verdict} | "
                     f"{r['killed_by'] or '-'} | {r['examples_to_kill'] or '-'} | {r['wall_s']} | "
                     f"{r['description']} |")
    b = report["baseline"]
    lines += ["", f"Unmutated package ({b['target']}): {'passes' if b['passed'] else '**FAILS**'} "
              f"on the union of the subsets ({b['wall_s']} s"
              + (f" over {b['processes']} processes" if b.get("processes", 1) > 1 else "") + ").",
              "", report.get("projection", ""), "", report["summary"]]
    return "\n".join(lines)


def _materialize_all(names, mutant_dir: str) -> None:
    """Create every mutated package before any run starts, so concurrent
    runs of one mutant (one per impl) never race on its copy; a PatchError
    is reported by run_mutant, by name."""
    os.environ["GDN_MUTANT_DIR"] = mutant_dir
    for name in names:
        try:
            materialize(name)
        except PatchError:
            pass


def _baseline_record(parts: List[dict]) -> dict:
    """The unmutated package's verdict over its processes (none: no baseline
    property in this shard); test_seconds lists every baseline test's time."""
    failed = [p for p in parts if p["returncode"] != 0]
    return {"target": "gdn_kernels:xla", "passed": not failed, "processes": len(parts),
            "wall_s": round(max((p["wall_s"] for p in parts), default=0.0), 1),
            "cpu_s": round(sum(p["wall_s"] for p in parts), 1),
            "log_tail": "\n".join(p["tail"] for p in failed) or None,
            "test_seconds": [s for p in parts
                             for s in (list(p["stats"].get("test_seconds", {}).values())
                                       or [p["wall_s"]])]}


def _print_result(r: dict) -> None:
    print(f"{r['mutant']:<32} {r['impl']:<7} "
          f"{r['status'].upper() if not r['killed'] else 'killed':<9} "
          f"by {r['killed_by']} after {r['examples_to_kill']} example(s), "
          f"{r['wall_s']} s", flush=True)


def kill_summary(results: List[dict], baseline_passed: bool, seconds: float) -> dict:
    """The kill-rate line and numbers of a list of mutant results."""
    killed = sum(r["killed"] for r in results)
    to_kill = [r["examples_to_kill"] for r in results if r["killed"] and r["examples_to_kill"]]
    median = statistics.median(to_kill) if to_kill else None
    line = (f"kill rate: {killed}/{len(results)} = {100.0 * killed / max(1, len(results)):.0f}% "
            f"(median examples to kill: {median}; unmutated package "
            f"{'passes' if baseline_passed else 'FAILS'}; {seconds:.0f} s)")
    return {"summary": line, "kill_rate": killed / max(1, len(results)),
            "median_examples_to_kill": median,
            "passed": killed == len(results) and baseline_passed}


def main(only: Optional[List[str]] = None, report_dir: str = ".",
         examples: Optional[int] = None, jobs: int = 1,
         shard: Optional[Tuple[int, int]] = None) -> int:
    names = only or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise SystemExit(f"gdn-verify mutants: unknown mutant(s) {unknown}")
    load_all()
    for n in names:                      # killers must be registered properties
        select(MUTANTS[n].killers)
    mutant_dir = tempfile.mkdtemp(prefix="gdn-mutants-")
    # a shard (I, N) runs every N-th (mutant, impl) and every N-th property
    # of the unmutated baseline; merge-reports joins the shards' reports
    union = shard_of(sorted({p for n in names for p in MUTANTS[n].killers}), shard)
    t0 = time.perf_counter()
    # the unmutated package may use the persistent compile cache (if the
    # caller configured one); mutants never do
    _materialize_all(names, mutant_dir)
    runs = shard_of([(name, impl) for name in names for impl in MUTANTS[name].impls], shard)
    jobs = max(1, jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        base_parts = [part for part in (shard_of(union, (j, jobs)) for j in range(1, jobs + 1))
                      if part]
        base_jobs = [pool.submit(run_suite_process, "gdn_kernels:xla", part, mutant_dir,
                                 examples, True) for part in base_parts]
        jobs_ = [pool.submit(run_mutant, name, impl, mutant_dir, examples)
                 for name, impl in runs]
        baseline = _baseline_record([job.result() for job in base_jobs])
        print(f"unmutated gdn_kernels:xla: {'passes' if baseline['passed'] else 'FAILS'} "
              f"({baseline['wall_s']} s)", flush=True)
        results = []
        for job in jobs_:
            results.append(job.result())
            _print_result(results[-1])
    verdict = kill_summary(results, baseline["passed"], time.perf_counter() - t0)
    from ..reports import projection_line
    projection = projection_line(baseline.pop("test_seconds") + [r["wall_s"] for r in results],
                                 "mutation-run")
    summary = verdict["summary"]
    report = {"mutants": results, "baseline": baseline, "summary": summary,
              "kill_rate": verdict["kill_rate"],
              "median_examples_to_kill": verdict["median_examples_to_kill"],
              "shard": f"{shard[0]}/{shard[1]}" if shard else "1/1",
              "wall_s": round(time.perf_counter() - t0, 1), "projection": projection}
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "mutation-report.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(report_dir, "mutation-report.md"), "w") as f:
        f.write(markdown(report) + "\n")
    print(projection, flush=True)
    print(summary, flush=True)
    return 0 if verdict["passed"] else 1
