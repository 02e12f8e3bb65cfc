"""python -m benchmarks  (also: gdn-verify bench)

Times forward and forward+backward of gated_delta_rule and
gdn_decoupled_conv1d for impl in {reference, xla, xla-autodiff, pallas, plain-chunked} over
a size ladder: median / min / max of the timed runs after warm-up, compile
time and compiled temp memory per shape, the ratios between impls (measured
side by side in one run), growth exponents in T, and the acceptance checks.
--packed adds the packed-sequence overhead: fwd+bwd of both ops (xla,
pallas) with packed segment_ids against segment_ids=None, interleaved.
--decode adds decode (one token per call, carried state: the public op
against a plain jitted recurrent step, per B) and chunked prefill (one pass
against pieces chaining the state); see benchmarks/decode.py.
--suite adds the verification suite's throughput under the dev and ci
profiles. Writes OUT/NAME.json, OUT/NAME.md and OUT/NAME.png (matplotlib,
the optional `bench` extra).

examples:
  python -m benchmarks                       # default ladder, all impls (~15 min on 2 busy CPU cores)
  python -m benchmarks --quick --repeats 1   # tiny ladder, a smoke run
  python -m benchmarks --sizes bench-d128,2,4096 --impls xla reference --modes fwd+bwd
  python -m benchmarks --packed-only         # packed overhead only (segment_ids against None)
  python -m benchmarks --decode-only --out benchmarks/results/cpu-2core   # decode.{json,md}
  python -m benchmarks --suite --suite-only  # suite throughput only
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform as _platform
import subprocess
import sys
import time
from typing import List, Optional

from benchmarks import accuracy, decode, packed, report, throughput, timing, workloads


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    lad = p.add_argument_group("ladder")
    lad.add_argument("--quick", action="store_true",
                     help="tiny ladder " + ", ".join(s.label for s in workloads.QUICK_LADDER))
    lad.add_argument("--sizes", nargs="+", metavar="LAYOUT,B,T", default=None,
                     help="explicit sizes: a head layout of strategies/shapes.py "
                          "(bench-quick, bench-d64, bench-d128, ...) with B and T, or "
                          "B,T,Hk,Hv,D[,Dv] (default: the ladder "
                          f"{workloads.DEFAULT_LADDER[0].label} .. "
                          f"{workloads.DEFAULT_LADDER[-1].label})")
    lad.add_argument("--impls", nargs="+", choices=workloads.IMPLS, default=list(workloads.IMPLS))
    lad.add_argument("--ops", nargs="+", choices=workloads.OPS, default=list(workloads.OPS))
    lad.add_argument("--modes", nargs="+", choices=workloads.MODES, default=list(workloads.MODES))
    lad.add_argument("--repeats", type=int, default=5,
                     help="timed runs per entry (median, min, max); default 5")
    lad.add_argument("--warmup", type=int, default=1, help="untimed runs first; default 1")
    lad.add_argument("--settle", type=int, default=1,
                     help="untimed runs of the same entry right before each timed run, "
                          "so that no timed run follows another impl; default 1")
    lad.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    lad.add_argument("--chunk-size", type=int, default=64)
    lad.add_argument("--seed", type=int, default=0)
    lad.add_argument("--time-budget", type=float, default=300.0, metavar="S",
                     help="skip an entry whose warm-up + settle + timed runs would take "
                          "longer (predicted from the previous rung, or measured at "
                          "warm-up); default 300 s")
    lad.add_argument("--mem-budget-gb", type=float, default=8.0, metavar="GB",
                     help="skip running an entry whose compiled temp + argument + output "
                          "bytes exceed this (compile figures are still recorded); "
                          "default 8 GiB")
    lad.add_argument("--no-ladder", action="store_true", help="skip the timing ladder")
    lad.add_argument("--no-accuracy", action="store_true",
                     help="skip the accuracy table under strong decay (every impl of --impls "
                          "against the float64 oracle; runs with the ladder by default)")
    lad.add_argument("--trace", metavar="DIR", default=None,
                     help="write a jax.profiler trace of one extra run per entry at "
                          "--trace-size (default: the acceptance size, else the largest)")
    lad.add_argument("--trace-size", metavar="LAYOUT,B,T", default=None)
    pk = p.add_argument_group("packed overhead (segment_ids against None; xla and pallas, "
                              "fwd+bwd)")
    pk.add_argument("--packed", action="store_true",
                    help="also time both ops with packed segment_ids against "
                         "segment_ids=None, interleaved, at --packed-size (a few minutes)")
    pk.add_argument("--packed-only", action="store_true", help="--packed and --no-ladder")
    pk.add_argument("--packed-size", metavar="LAYOUT,B,T", default=None,
                    help="default: the acceptance size "
                         f"{workloads.ACCEPTANCE_SIZE.label} (with --quick: "
                         f"{workloads.PACKED_QUICK_SIZE.label})")
    pk.add_argument("--packed-repeats", type=int, default=packed.DEFAULT_REPEATS,
                    help="timed runs per variant; default "
                         f"{packed.DEFAULT_REPEATS}")
    dc = p.add_argument_group("decode and chunked prefill (carried state, benchmarks/decode.py)")
    dc.add_argument("--decode", action="store_true",
                    help="also time decode (T=1 per call) of the public op against a plain "
                         "jitted recurrent step at B in "
                         + ", ".join(str(s.B) for s in workloads.DECODE_SIZES)
                         + ", and chunked prefill at " + workloads.PREFILL_SIZE.label)
    dc.add_argument("--decode-only", action="store_true",
                    help="--decode and --no-ladder (default --name decode)")
    dc.add_argument("--decode-parts", nargs="+", choices=("decode", "prefill"),
                    default=["decode", "prefill"])
    dc.add_argument("--decode-batches", nargs="+", type=int, metavar="B", default=None,
                    help="batch sizes over the layout " + workloads.DECODE_LAYOUT
                         + " (default " + " ".join(str(b) for b in workloads.DECODE_BATCHES)
                         + ")")
    dc.add_argument("--decode-impls", nargs="+", choices=decode.DECODE_IMPLS,
                    default=list(decode.DECODE_IMPLS),
                    help="our impls timed against the plain step (xla is the checked one)")
    dc.add_argument("--decode-steps", type=int, default=decode.DEFAULT_STEPS,
                    help=f"tokens per timed loop; default {decode.DEFAULT_STEPS}")
    dc.add_argument("--decode-count-steps", type=int, default=decode.DEFAULT_COUNT_STEPS,
                    help="tokens of the untimed loop that counts compiles; default "
                         f"{decode.DEFAULT_COUNT_STEPS}")
    dc.add_argument("--decode-repeats", type=int, default=decode.DEFAULT_REPEATS,
                    help=f"timed loops (and prefill runs) per entry; default "
                         f"{decode.DEFAULT_REPEATS}")
    dc.add_argument("--decode-sync", choices=decode.SYNCS, default="step",
                    help="step: block on every step's output (a serving loop reads the "
                         "token); end: once per loop. Default step")
    st = p.add_argument_group("suite throughput (minutes)")
    st.add_argument("--suite", action="store_true",
                    help="also run the suite subset under each --suite-profiles profile")
    st.add_argument("--suite-only", action="store_true", help="--suite and --no-ladder")
    st.add_argument("--suite-profiles", nargs="+", default=["dev", "ci"],
                    choices=("dev", "ci", "nightly"))
    st.add_argument("--suite-target", default=None,
                    help=f"MODULE[:IMPL] (default: the suite's default target, "
                         f"{throughput.DEFAULT_TARGET})")
    st.add_argument("--suite-properties", default=",".join(throughput.DEFAULT_PROPERTIES),
                    metavar="ID[,ID...]",
                    help="property ids, passed as --gdn-properties (default: "
                         + ",".join(throughput.DEFAULT_PROPERTIES) + ")")
    st.add_argument("--suite-ci-examples", type=int, default=throughput.DEFAULT_CI_EXAMPLES,
                    help=f"GDN_CI_EXAMPLES for the ci profile; default "
                         f"{throughput.DEFAULT_CI_EXAMPLES}")
    st.add_argument("--suite-timeout", type=float, default=1800.0, metavar="S")
    st.add_argument("--suite-json", metavar="FILE", default=None,
                    help="instead of running the suite, copy the suite section of an "
                         "earlier run's JSON (its own timestamps and load are kept)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="bench-results", help="output directory")
    out.add_argument("--name", default=None,
                     help="file stem (NAME.json/.md/.png); default bench (decode with "
                          "--decode-only)")
    out.add_argument("--no-plot", action="store_true")
    out.add_argument("--strict", action="store_true",
                     help="exit 1 when a measured acceptance check misses its target")
    return p


def _git_describe() -> Optional[str]:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"],
                              cwd=throughput.REPO_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def _meta(argv) -> dict:
    import jax
    import jaxlib
    import numpy as np
    dev = jax.devices()[0]
    return {
        "command": "python -m benchmarks " + " ".join(argv),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
        "numpy_version": np.__version__, "python": _platform.python_version(),
        "platform": dev.platform, "device_kind": dev.device_kind,
        "device_count": jax.device_count(), "cpu_count": os.cpu_count(),
        "machine": _platform.machine(),
        "pallas_mode": timing.interpret_mode("pallas"),
        "git": _git_describe(),
        "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR",
                                                "GDN_INTERPRET", "JAX_ENABLE_X64")
                if os.environ.get(k) is not None},
        "loadavg_start": list(os.getloadavg()),
    }


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.suite_only:
        args.suite, args.no_ladder = True, True
    if args.packed_only:
        args.packed, args.no_ladder = True, True
    decode_only = args.decode_only and not (args.packed or args.suite)
    if args.decode_only:
        args.decode, args.no_ladder = True, True
    if args.name is None:
        args.name = "decode" if decode_only else "bench"
    if args.decode and (args.decode_repeats < 1 or args.decode_steps < 1
                        or args.decode_count_steps < 1
                        or min(args.decode_batches or [1]) < 1):
        _parser().error("--decode-repeats, --decode-steps, --decode-count-steps and "
                        "--decode-batches must be >= 1")
    if args.repeats < 1 or args.warmup < 0 or args.settle < 0 or args.packed_repeats < 1:
        _parser().error("--repeats and --packed-repeats must be >= 1, --warmup and "
                        "--settle >= 0")
    try:
        if args.sizes:
            sizes = tuple(workloads.parse_size(s) for s in args.sizes)
        else:
            sizes = workloads.QUICK_LADDER if args.quick else workloads.DEFAULT_LADDER
        trace_size = workloads.parse_size(args.trace_size) if args.trace_size else (
            workloads.ACCEPTANCE_SIZE if workloads.ACCEPTANCE_SIZE in sizes else sizes[-1])
        packed_size = workloads.parse_size(args.packed_size) if args.packed_size else (
            workloads.PACKED_QUICK_SIZE if args.quick else workloads.ACCEPTANCE_SIZE)
    except ValueError as err:
        _parser().error(str(err))
    log = timing.stderr_log

    t0 = time.perf_counter()
    meta = _meta(argv)
    log(f"benchmarks: {meta['device_kind']} ({meta['platform']}), jax {meta['jax_version']}, "
        f"load {meta['loadavg_start'][0]:.2f}; pallas mode {meta['pallas_mode']}")
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        log("note: JAX_COMPILATION_CACHE_DIR is set: compile times may be cache hits")
    if args.repeats < 5 and not args.no_ladder:
        log(f"note: --repeats {args.repeats} < 5: a smoke run, not a measurement")
    cfg = timing.LadderConfig(
        sizes=sizes, ops=tuple(args.ops), impls=tuple(args.impls), modes=tuple(args.modes),
        repeats=args.repeats, warmup=args.warmup, settle=args.settle, dtype=args.dtype,
        chunk=args.chunk_size,
        seed=args.seed, time_budget_s=args.time_budget,
        mem_budget_bytes=int(args.mem_budget_gb * timing.GiB),
        trace_dir=args.trace, trace_size=trace_size)
    records = [] if args.no_ladder else timing.run_ladder(cfg, log)
    accuracy_doc = None
    if not (args.no_ladder or args.no_accuracy):
        accuracy_doc = accuracy.run(
            cfg.ops, cfg.impls, accuracy.ACCURACY_QUICK_SIZE if args.quick
            else accuracy.ACCURACY_SIZE, cfg.chunk, cfg.seed, log)
    packed_doc = None
    if args.packed:
        packed_doc = packed.run(packed.config_for(cfg, args.packed_repeats), packed_size, log)
    decode_doc = None
    if args.decode:
        decode_doc = decode.run(decode.config_from_args(args, args.quick), log)
    fits = report.growth_fits(records)
    doc = {
        "meta": meta,
        "config": {"sizes": [s.as_dict() for s in sizes], "ops": list(cfg.ops),
                   "impls": list(cfg.impls), "modes": list(cfg.modes),
                   "repeats": cfg.repeats, "warmup": cfg.warmup, "settle": cfg.settle,
                   "dtype": cfg.dtype,
                   "chunk": cfg.chunk, "seed": cfg.seed, "time_budget_s": cfg.time_budget_s,
                   "mem_budget_bytes": cfg.mem_budget_bytes,
                   "acceptance_size": workloads.ACCEPTANCE_SIZE.as_dict(),
                   "acceptance_targets": report.TARGETS},
        "results": records,
        "ratios": report.ratios(records),
        "fits": fits,
        "acceptance": (report.acceptance(records, fits)
                       + report.packed_acceptance(packed_doc, sorted(
                           {r["op"] for r in records}, key=list(workloads.OPS).index))),
        "packed": packed_doc,
        "accuracy": accuracy_doc,
        "suite": None,
    }
    if decode_only:
        doc = {"meta": meta, "decode": decode_doc}
    elif decode_doc is not None:
        doc["decode"] = decode_doc
    if args.suite_json:
        import json
        with open(args.suite_json) as f:
            earlier = json.load(f)
        doc["suite"] = earlier.get("suite")
        meta["suite_from"] = {"file": os.path.abspath(args.suite_json),
                              "started": earlier["meta"].get("started"),
                              "git": earlier["meta"].get("git")}
    elif args.suite:
        properties = tuple(p for p in args.suite_properties.split(",") if p)
        doc["suite"] = throughput.run(tuple(args.suite_profiles), target=args.suite_target,
                                      properties=properties,
                                      ci_examples=args.suite_ci_examples,
                                      timeout_s=args.suite_timeout, log=log)
    meta["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = time.perf_counter() - t0

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, args.name)
    report.write_json(stem + ".json", doc)
    if decode_only:
        md = decode.markdown(doc)
    else:
        md = report.markdown(doc)
        if decode_doc is not None:
            md += "\n" + decode.markdown_section(decode_doc)
    with open(stem + ".md", "w") as f:
        f.write(md)
    written = [stem + ".json", stem + ".md"]
    if not args.no_plot and records:
        why = report.plot(doc, stem + ".png")
        if why:
            log(f"plot skipped: {why}")
        else:
            written.append(stem + ".png")
    print(md)
    log("wrote " + ", ".join(written))
    missed = [a for a in doc.get("acceptance", []) + (decode_doc or {}).get("acceptance", [])
              if a["pass"] is False]
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
