"""python -m benchmarks.build_cost: where a new program's build time goes.

The suite is compile-bound on a CPU: a property example builds new programs
(a new shape each) and runs them in milliseconds. This measures, per impl,
what building one program costs under the suite's XLA:CPU flags
(verification/engine/compile_settings.py, applied before JAX starts): the
seconds of tracing to a jaxpr, lowering to StableHLO and XLA's compile
(median over `--programs` fresh programs: T = T0, T0 + 1, ..., each a new
shape), the StableHLO ops of the program and its commonest op kinds, and,
for the Pallas kernels, the DMA starts and waits in each kernel's jaxpr
(inside a conditional, pl.when, or not): interpreted, each one is discharged
into dozens of ops of index arithmetic (every start index of every sliced
dimension normalised by a compare, an add and a select).

  python -m benchmarks.build_cost                        # mixer and delta rule, fwd+bwd, pallas and xla
  python -m benchmarks.build_cost --ops mixer --impls pallas --programs 5 --out build.json

Measured numbers and what they decided: benchmarks/README.md, "Where a
program's build time goes".
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import time
from typing import Dict, List

from verification.engine import compile_settings

DMA_PRIMITIVES = ("dma_start", "dma_wait")
TOP_OPS = 6


def _kernel_dma_counts(closed_jaxpr) -> Dict[str, Dict[str, int]]:
    """{kernel name: {"dma_start": n, "dma_wait": n, "in_conditional": n}}
    of every pallas_call in a traced program's jaxpr."""
    from jax._src.core import jaxprs_in_params as subjaxprs_of

    def count(jaxpr, counts, in_cond):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in DMA_PRIMITIVES:
                counts[name] += 1
                counts["in_conditional"] += in_cond
            for sub in subjaxprs_of(eqn.params):
                count(sub, counts, in_cond or name == "cond")

    kernels = {}

    def find(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                counts = collections.Counter()
                count(eqn.params["jaxpr"], counts, False)
                name = eqn.params.get("name") or f"kernel{len(kernels)}"
                kernels[name] = {k: counts[k] for k in DMA_PRIMITIVES + ("in_conditional",)}
            for sub in subjaxprs_of(eqn.params):
                find(sub)

    find(closed_jaxpr.jaxpr)
    return kernels


def _stablehlo_ops(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r"=\s*\"?stablehlo\.([a-z_]+)", text))


def measure(op: str, impl: str, mode: str, layout: str, batch: int, t0: int, chunk: int,
            programs: int) -> dict:
    """Build `programs` programs of (op, impl, mode) at T = t0, t0 + 1, ...
    (each a new shape); the median seconds per stage, the last program's
    StableHLO op counts and its kernels' DMAs."""
    import jax
    from benchmarks import workloads

    stages = {"trace_s": [], "lower_s": [], "compile_s": []}
    for t in range(t0, t0 + programs):
        size = workloads.Size.of(layout, batch, t)
        fn = jax.jit(workloads.build_fn(op, impl, mode, size, chunk))
        args = workloads.device_inputs(op, size, jax.numpy.float32, seed=0)
        start = time.perf_counter()
        traced = fn.trace(*args)
        traced_at = time.perf_counter()
        lowered = traced.lower()
        lowered_at = time.perf_counter()
        lowered.compile()
        done = time.perf_counter()
        stages["trace_s"].append(traced_at - start)
        stages["lower_s"].append(lowered_at - traced_at)
        stages["compile_s"].append(done - lowered_at)
    ops = _stablehlo_ops(lowered.as_text())
    return {"op": op, "impl": impl, "mode": mode, "size": size.label, "chunk": chunk,
            "programs": programs,
            **{k: round(statistics.median(v), 3) for k, v in stages.items()},
            "stablehlo_ops": sum(ops.values()),
            "top_ops": dict(ops.most_common(TOP_OPS)),
            "kernels": _kernel_dma_counts(traced.jaxpr)}


def markdown(rows: List[dict]) -> str:
    lines = ["| op | impl | mode | size | trace s | lower s | compile s | StableHLO ops | "
             "commonest ops | kernel DMAs (starts / waits, in pl.when) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k} {v}" for k, v in r["top_ops"].items())
        dmas = "; ".join(f"{name}: {c['dma_start']} / {c['dma_wait']}, {c['in_conditional']}"
                         for name, c in r["kernels"].items()) or "-"
        lines.append(f"| {r['op']} | {r['impl']} | {r['mode']} | {r['size']} | "
                     f"{r['trace_s']:.2f} | {r['lower_s']:.2f} | {r['compile_s']:.2f} | "
                     f"{r['stablehlo_ops']} | {top} | {dmas} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.build_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", default=["mixer", "delta_rule"],
                        choices=["mixer", "delta_rule"])
    parser.add_argument("--impls", nargs="+", default=["pallas", "xla"])
    parser.add_argument("--mode", default="fwd+bwd", choices=["fwd", "fwd+bwd"])
    parser.add_argument("--layout", default="gva2-2keys-dk<dv",
                        help="a head layout of strategies/shapes.py (default: a lattice one)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--t0", type=int, default=72, help="T of the first program")
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--programs", type=int, default=3,
                        help="programs built per entry (T = t0, t0 + 1, ...)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    flags = compile_settings.apply()          # before JAX's first computation
    rows = [measure(op, impl, args.mode, args.layout, args.batch, args.t0, args.chunk,
                    args.programs)
            for op in args.ops for impl in args.impls]
    print(f"compile settings: {flags}")
    print(markdown(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"compile_settings": flags, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
