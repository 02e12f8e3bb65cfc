"""`gdn-verify mutants`: the seeded-bug kill report.

For each mutant and each impl whose code it breaks, a pytest session runs
the registered properties against gdn_mutant_<name>:<impl> under the
`kill` profile (ci's examples, derandomized, no shrinking), each property
stopping at its first failing example; every property of the session runs
(no -x), so the report records every property that killed the mutant
(`kills`: property -> examples to kill; `held`: those that ran and held),
which the kill matrix (mutation-report.svg, verification/engine/picture.py)
draws. The sessions of one job slot run one after
another in one worker process (verification/mutants/worker.py says why
that changes nothing a session sees). The declared faster subset: only the mutant's
declared killer properties run first (selected by property id,
--gdn-properties); if none of them fails, every property runs (and a
survivor is reported). A mutant counts as killed only when a property
recorded a failure on it; a mutant whose patch no longer applies, or whose
run errors outside the properties, is reported by name as an error and
fails the gate.

The baseline: every killing example (the counterexample file each killing
property wrote) is replayed on the unmutated package with the same impl
(`gdn-verify replay FILE... --module gdn_kernels`) and must pass there,
so no kill is the property failing for a reason of its own.

The compile cache: a mutant session reads the persistent compile cache of
the caller (if one is configured) and never writes to it. JAX keys an
entry by a hash of the program (debug info stripped), the compile options,
the devices, the XLA flags and the jax/jaxlib versions, and caches nothing
that holds a host callback; a mutated program is a different program, so
the only entries a mutant can read are those of code its patch did not
change (the float64 oracle, mostly), which the suite's own run left there.
verification/tests/test_mutation_zoo.py checks that a mutated kernel lowers to a
different program than the original.

Writes mutation-report.json, .md and .svg; exits 1 if any mutant
survives or errors, or a killing example fails on the unmutated package.
--jobs N runs N worker processes at once (and the baseline replays in
up to N processes); the report keeps the catalog's order.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import sys
import queue
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

from ..properties import load_all
from ..engine.registry import select
from ..engine.shards import shard_of
from . import MUTANTS, PREFIX, PatchError, materialize, mutant_root

SUITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPERTY_TESTS = os.path.join(SUITE_DIR, "tests", "test_properties.py")
PROFILE = "kill"
UNMUTATED = "gdn_kernels"
_CACHE_WRITE_THRESHOLD = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def _env(run_dir: str, stats_file: str) -> dict:
    """A mutant session's environment: the kill profile, its own
    counterexample folder, the caller's compile cache read-only (an entry
    is written only for a compile slower than the threshold: 1e9 s), and
    the caller's folder of mutated packages (materialised before any run
    starts, so the runs of one mutant on two impls share one copy)."""
    env = dict(os.environ)
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        env[_CACHE_WRITE_THRESHOLD] = "1e9"
    env["GDN_MUTANT_DIR"] = mutant_root()
    env["GDN_STATS_FILE"] = stats_file
    env["GDN_PROFILE"] = PROFILE
    env["GDN_COUNTEREXAMPLES"] = os.path.join(run_dir, "counterexamples")
    return env


class SessionWorker:
    """A verification.mutants.worker process (started on first use, again
    after it died) running one suite session after another; one per job
    slot of the mutation run."""

    def __init__(self, examples: Optional[int], log_dir: str):
        self.examples, self.log_dir, self.proc, self.log = examples, log_dir, None, None

    def _start(self) -> None:
        env = _env(self.log_dir, os.path.join(self.log_dir, "unused.json"))
        if self.examples:
            env["GDN_CI_EXAMPLES"] = str(self.examples)
        if self.log is not None:
            self.log.close()                 # the log of a process that died
        self.log = tempfile.NamedTemporaryFile("w+", dir=self.log_dir, suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "gdn_verify.run",
                                      "verification.mutants.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=os.getcwd())

    def run(self, args: List[str], env: dict, kind: str = "pytest") -> dict:
        """One session (see worker.py for the kinds): {returncode, wall_s,
        tail}; a worker that died is an error of this session (returncode 3,
        its stderr's tail)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps({"kind": kind, "args": args, "env": env}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if line:
            return json.loads(line)
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        with open(self.log.name) as f:
            tail = f.read()[-3000:]
        return {"returncode": 3, "wall_s": time.perf_counter() - t0,
                "tail": f"the worker process died:\n{tail}"}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        if self.log is not None:
            self.log.close()


def run_suite_process(worker: SessionWorker, target: str, properties: Optional[List[str]],
                      run_dir: str) -> dict:
    """One suite session (in the worker's process) running the given
    properties (None: every registered property) against target under the
    kill profile; returns its stats, wall time and the counterexample files
    it wrote (in run_dir)."""
    os.makedirs(run_dir, exist_ok=True)
    stats_file = tempfile.mktemp(suffix=".json", dir=run_dir)
    args = [PROPERTY_TESTS, "-p", "gdn_verify",
            "-q", "--hypothesis-profile", PROFILE, "--gdn-target", target,
            "-p", "no:cacheprovider", "--gdn-properties",
            ",".join(p.id for p in select(properties)) if properties else "all"]
    counterexamples = os.path.join(run_dir, "counterexamples")
    result = worker.run(args, {"GDN_STATS_FILE": stats_file,
                               "GDN_COUNTEREXAMPLES": counterexamples})
    stats = {}
    if os.path.exists(stats_file):
        with open(stats_file) as f:
            stats = json.load(f)
    return {"returncode": result["returncode"], "wall_s": result["wall_s"], "stats": stats,
            "counterexamples": sorted(glob.glob(os.path.join(counterexamples, "*.json"))),
            "tail": result["tail"]}


def _killer(stats: dict):
    for name, st in stats.get("properties", {}).items():
        if st["failures"]:
            return name, st["first_failure_at"]
    return None, None


def _kill_table(stats: dict) -> Tuple[dict, List[str]]:
    """Every property of a session that killed the mutant ({property:
    examples to kill}) and those that ran and held."""
    props = stats.get("properties", {})
    kills = {name: st["first_failure_at"] for name, st in props.items() if st["failures"]}
    held = [name for name, st in props.items() if not st["failures"] and st.get("verdict") == "held"]
    return kills, held


def run_mutant(name: str, impl: str, mutant_dir: str, worker: SessionWorker) -> dict:
    mutant = MUTANTS[name]
    target = f"{PREFIX}{name}:{impl}"
    record = {"mutant": name, "impl": impl, "description": mutant.description,
              "killed": False, "killed_by": None, "examples_to_kill": None,
              "killing_example": None}
    try:
        materialize(name)
    except PatchError as err:
        return record | {"status": "patch failed", "wall_s": 0.0, "subset": "-",
                         "log_tail": str(err)}
    run_dir = os.path.join(mutant_dir, "runs", f"{name}-{impl}")
    result = run_suite_process(worker, target, list(mutant.killers), run_dir)
    subset = "declared killers: " + ", ".join(mutant.killers)
    wall = result["wall_s"]
    if result["returncode"] == 0:          # subset missed it: run every property
        result = run_suite_process(worker, target, None, run_dir)
        subset = "every property (declared killers missed it)"
        wall += result["wall_s"]
    killer, at = _killer(result["stats"])
    kills, held = _kill_table(result["stats"])
    killed = killer is not None and result["returncode"] == 1
    status = "killed" if killed else ("survived" if result["returncode"] == 0 else "error")
    examples = {name: next((f for f in result["counterexamples"]
                            if os.path.basename(f).startswith(f"{name}-")), None)
                for name in kills} if killed else {}
    return record | {"status": status, "killed": killed, "killed_by": killer,
                     "examples_to_kill": at, "kills": kills, "held": held,
                     "wall_s": round(wall, 1), "subset": subset,
                     "killing_example": examples.get(killer),
                     "killing_examples": examples,
                     "log_tail": None if killed else result["tail"]}


def _killing_files(record: dict) -> dict:
    """{property: its killing example file, or None} of a killed mutant's
    record (a record of the first killer alone: that one)."""
    if "killing_examples" in record:
        return record["killing_examples"]
    return {record.get("killed_by") or "its killer": record.get("killing_example")}


def replay_killing_examples(results: List[dict], workers: List[SessionWorker]) -> dict:
    """The baseline: each killed mutant's killing examples (one per property
    that killed it) replayed on the unmutated package (same impl), split
    over the workers. A kill without its counterexample file fails the
    baseline (nothing shows the kill is the mutant's)."""
    killed = [r for r in results if r["killed"]]
    missing = [f"{r['mutant']}:{r['impl']} ({prop})" for r in killed
               for prop, f in _killing_files(r).items() if not f]
    files = [f for r in killed for f in _killing_files(r).values() if f]
    n = len(workers)
    parts = [part for part in (shard_of(files, (j, n)) for j in range(1, n + 1)) if part]
    args = ["replay", "--module", UNMUTATED]
    env = {"GDN_PROFILE": None, "GDN_STATS_FILE": None}
    with ThreadPoolExecutor(max_workers=max(1, len(parts))) as pool:
        runs = list(pool.map(lambda wp: wp[0].run(args + wp[1], env, kind="cli"),
                             zip(workers, parts)))
    failed = [run for run in runs if run["returncode"] != 0]
    tails = [run["tail"] for run in failed]
    if missing:
        tails.append(f"killed without a counterexample file: {', '.join(missing)}")
    return {"target": f"{UNMUTATED} (each killing example, on its impl)",
            "passed": not failed and not missing, "replayed": len(files),
            "processes": len(parts),
            "wall_s": round(max((run["wall_s"] for run in runs), default=0.0), 1),
            "cpu_s": round(sum(run["wall_s"] for run in runs), 1),
            "log_tail": "\n".join(tails) or None,
            "test_seconds": [run["wall_s"] for run in runs]}


def markdown(report: dict) -> str:
    lines = ["| mutant | impl | killed | killed by | examples to kill | wall s | what it models |",
             "|---|---|---|---|---|---|---|"]
    for r in report["mutants"]:
        verdict = "yes" if r["killed"] else f"**{r['status'].upper()}**"
        others = [p for p in r.get("kills", {}) if p != r["killed_by"]]
        by = (r["killed_by"] or "-") + (f" (also: {', '.join(others)})" if others else "")
        lines.append(f"| {r['mutant']} | {r['impl']} | {verdict} | "
                     f"{by} | {r['examples_to_kill'] or '-'} | {r['wall_s']} | "
                     f"{r['description']} |")
    lines += ["", baseline_line(report["baseline"]),
              "", report.get("projection", ""), "", report["summary"]]
    return "\n".join(lines)


def baseline_line(b: dict) -> str:
    """The baseline's verdict as one sentence."""
    timing = (f" ({b['wall_s']} s" + (f" over {b['processes']} processes"
                                      if b.get("processes", 1) > 1 else "") + ")"
              if "wall_s" in b else "")
    return (f"Killing examples replayed on the unmutated package ({UNMUTATED}, each on "
            f"its mutant's impl): {'all pass' if b['passed'] else '**SOME FAIL**'}"
            + (f", {b['replayed']} example(s)" if "replayed" in b else "") + timing + ".")


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
            f"(median examples to kill: {median}; killing examples "
            f"{'pass' if baseline_passed else 'FAIL'} unmutated; {seconds:.0f} s)")
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
    # a shard (I, N) runs every N-th (mutant, impl); merge-reports joins the
    # shards' reports
    t0 = time.perf_counter()
    _materialize_all(names, mutant_dir)
    runs = shard_of([(name, impl) for name in names for impl in MUTANTS[name].impls], shard)
    jobs = max(1, jobs)
    # one worker per job slot (its process starts on first use), lent to
    # one mutant run at a time and reused from mutant to mutant
    workers = [SessionWorker(examples, mutant_dir) for _ in range(jobs)]
    idle: "queue.Queue[SessionWorker]" = queue.Queue()
    for worker in workers:
        idle.put(worker)

    def run_on_idle_worker(name, impl):
        worker = idle.get()
        try:
            return run_mutant(name, impl, mutant_dir, worker)
        finally:
            idle.put(worker)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_on_idle_worker, name, impl) for name, impl in runs]
            results = []
            for future in futures:
                results.append(future.result())
                _print_result(results[-1])
        baseline = replay_killing_examples(results, workers)
    finally:
        for worker in workers:
            worker.close()
    print(baseline_line(baseline), flush=True)
    verdict = kill_summary(results, baseline["passed"], time.perf_counter() - t0)
    from ..engine.shards import projection_line
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
    from ..engine import picture
    picture.write_kill_matrix(report, os.path.join(report_dir, "mutation-report.svg"))
    with open(os.path.join(report_dir, "mutation-report.md"), "w") as f:
        f.write(markdown(report) + "\n")
    print(projection, flush=True)
    print(summary, flush=True)
    return 0 if verdict["passed"] else 1
