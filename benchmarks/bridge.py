"""python -m benchmarks.bridge: the torch bridge's overhead.

The properties-only dev run (README command 1's `gdn-verify --profile dev`)
on the torch token-scan fixture (verification/fixture_kernels/torch_targets/
token_scan: torch through from_torch) against the same math as a JAX target
(.../torch_targets/jax_twin: the same recurrence, conventions and adapters),
each cold (an empty compile cache) and warm (the cache the cold run filled),
timed by benchmarks.main_job. A program holding a host callback is neither
kept by the persistent compile cache nor by the program store, so the torch
target's warm run compiles its programs again: the figure that matters to
an author running the suite after every edit is the warm ratio.

  python -m benchmarks.bridge                      # 1 round, both targets
  python -m benchmarks.bridge --rounds 2 --out benchmarks/results/cpu-2core-epyc/bridge.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import main_job

TORCH = "verification.fixture_kernels.torch_targets.token_scan"
JAX = "verification.fixture_kernels.torch_targets.jax_twin"
# the goal: the torch target's wall at most this times the JAX one's
GOAL_RATIO = 2.0


def measure(rounds: int, extra_args: List[str] = (), log=print) -> dict:
    """Both targets' main_job runs and the torch / JAX wall ratios (cold,
    warm); extra_args: more gdn-verify arguments (a smoke run's)."""
    runs = {}
    for name, spec in (("jax", JAX), ("torch", TORCH)):
        log(f"{name}: {spec}")
        runs[name] = main_job.run(rounds, ["--profile", "dev", "--target", spec, *extra_args],
                                  log=log)
    ratios = {kind: runs["torch"]["median"][kind]["wall_s"] / runs["jax"]["median"][kind]["wall_s"]
              for kind in ("cold", "warm")}
    return {"rounds": rounds, "targets": {"jax": JAX, "torch": TORCH}, "runs": runs,
            "ratio": ratios, "goal_ratio": GOAL_RATIO}


def markdown(doc: dict) -> str:
    lines = ["| target | cold wall s | warm wall s | examples | programs (warm: from cache) |",
             "|---|---:|---:|---:|---:|"]
    for name in ("jax", "torch"):
        cold, warm = (doc["runs"][name]["median"][k] for k in ("cold", "warm"))
        lines.append(f"| {name} | {cold['wall_s']:.0f} | {warm['wall_s']:.0f} | "
                     f"{cold.get('examples', 0):.0f} | {cold.get('programs', 0):.0f} "
                     f"({warm.get('cache_hits', 0):.0f}) |")
    lines.append(f"| torch / jax | {doc['ratio']['cold']:.2f} | {doc['ratio']['warm']:.2f} | | |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bridge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--examples", type=int, default=None, help="(a smoke run) examples")
    p.add_argument("--properties", default=None, help="(a smoke run) properties")
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    extra = [arg for name in ("examples", "properties") if getattr(args, name) is not None
             for arg in (f"--{name}", str(getattr(args, name)))]
    doc = measure(args.rounds, extra)
    print(markdown(doc))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
