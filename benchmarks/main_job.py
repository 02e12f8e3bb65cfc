"""python -m benchmarks.main_job: the main job's wall time, cold and warm.

The main job is README command 1's `gdn-verify --profile dev`: the
properties on the default target, on every core, with the persistent
compilation cache. Each round runs it twice from a temporary directory with
a fresh cache directory: cold (an empty cache), then warm (the cache the
cold run filled). Reported per run, and as the median over rounds: wall
seconds, properties, examples checked, programs built, programs read from
the cache, examples per program, exit status.

  python -m benchmarks.main_job                     # dev profile, 2 rounds
  python -m benchmarks.main_job --rounds 1 --profile ci --out main-job.json
  python -m benchmarks.main_job --target my_kernels --examples 2 --properties determinism
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(workdir: str, cache_dir: str, gdn_verify_args: List[str],
            timeout_s: float) -> dict:
    """gdn-verify with these arguments in workdir, the cache in cache_dir;
    its wall time and the figures of its JSON report."""
    report = os.path.join(workdir, f"report-{time.monotonic_ns()}.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GDN_", "JAX_"))}
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir,
               GDN_COUNTEREXAMPLES=os.path.join(workdir, "counterexamples"))
    cmd = [sys.executable, "-m", "verification.cli", *gdn_verify_args, "--json", report]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    wall = time.perf_counter() - t0
    result = {"wall_s": wall, "returncode": proc.returncode}
    if not os.path.exists(report):
        result["error"] = (proc.stdout + proc.stderr)[-2000:]
        return result
    with open(report) as f:
        data = json.load(f)
    props = data["properties"]
    examples = sum(p["examples"] - p.get("unresolved", 0) for p in props.values())
    result.update(properties=len(props), examples=examples, programs=data["compiles"],
                  cache_hits=data.get("cache_hits", 0),
                  examples_per_program=examples / data["compiles"] if data["compiles"] else None,
                  verdicts={name: p["verdict"] for name, p in props.items()},
                  per_property={name: {"examples": p["examples"] - p.get("unresolved", 0),
                                       "programs": p["compiles"],
                                       "seconds": round(p["seconds"], 1),
                                       "compile_s": round(p.get("compile_s", 0.0), 1)}
                                for name, p in props.items()})
    return result


def run(rounds: int, gdn_verify_args: List[str], timeout_s: float = 3600.0,
        log=print) -> dict:
    """`rounds` rounds of (cold, warm); the runs and their medians."""
    runs = {"cold": [], "warm": []}
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="gdn-main-job-") as tmp:
            cache = os.path.join(tmp, "jax-cache")
            for kind in ("cold", "warm"):
                r = one_run(tmp, cache, gdn_verify_args, timeout_s)
                runs[kind].append(r)
                log(f"round {i + 1} {kind}: {r['wall_s']:.0f} s, "
                    f"{r.get('examples', '?')} examples, {r.get('programs', '?')} programs "
                    f"({r.get('cache_hits', '?')} from the cache), exit {r['returncode']}")
    medians = {kind: {key: statistics.median(r[key] for r in rs)
                      for key in ("wall_s", "examples", "programs", "cache_hits")
                      if all(key in r for r in rs)}
               for kind, rs in runs.items()}
    return {"args": gdn_verify_args, "rounds": rounds, "runs": runs, "median": medians,
            "machine": {"cores": os.cpu_count(), "loadavg_end": list(os.getloadavg())}}


def markdown(doc: dict) -> str:
    lines = ["| run | wall s | examples | programs | from cache | examples / program |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind in ("cold", "warm"):
        m = doc["median"][kind]
        per = (m["examples"] / m["programs"]) if m.get("programs") else float("nan")
        lines.append(f"| {kind} (median of {doc['rounds']}) | {m.get('wall_s', 0):.0f} | "
                     f"{m.get('examples', 0):.0f} | {m.get('programs', 0):.0f} | "
                     f"{m.get('cache_hits', 0):.0f} | {per:.2f} |")
    return "\n".join(lines + ["", property_table(doc)])


def property_table(doc: dict) -> str:
    """Per property, first round: examples, programs and seconds, cold and warm
    (seconds are the property's own, summed over the workers)."""
    cold, warm = (doc["runs"][kind][0].get("per_property", {}) for kind in ("cold", "warm"))
    lines = ["| property | examples | programs cold | s cold | programs warm | s warm |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in sorted(cold, key=lambda n: -cold[n]["seconds"]):
        c, w = cold[name], warm.get(name, {})
        lines.append(f"| {name} | {c['examples']} | {c['programs']} | {c['seconds']:.1f} | "
                     f"{w.get('programs', '-')} | {w.get('seconds', float('nan')):.1f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.main_job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", default="dev", choices=("dev", "ci", "nightly"))
    p.add_argument("--target", default=None)
    p.add_argument("--examples", type=int, default=None)
    p.add_argument("--properties", default=None)
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    gdn_args = ["--profile", args.profile]
    for name in ("target", "examples", "properties"):
        if getattr(args, name) is not None:
            gdn_args += [f"--{name}", str(getattr(args, name))]
    doc = run(args.rounds, gdn_args)
    print(markdown(doc))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    bad = [r for rs in doc["runs"].values() for r in rs if r["returncode"] != 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
