"""Where the extra time of packed sequences (segment_ids) goes, through the
public API only (gdn_kernels.gated_delta_rule and gdn_decoupled_conv1d, as
the harness builds them: benchmarks/workloads.py, timing.compile_entry).

  python -m benchmarks.profile_packed [--size LAYOUT,B,T] [--repeats N]
                                      [--impls xla pallas] [--ops delta_rule mixer]
                                      [--sections ops trace]

At one size (default the acceptance size), with the packing of
workloads.packed_layout, every timing interleaved and settled (each timed run
right after an untimed run of itself):
  ops    whole ops, per op and impl, fwd and fwd+bwd: unpacked
         (segment_ids=None), packed, and "one-doc" (segment_ids all 1: the
         packed code path without any document boundary or padding); cost
         analysis (GFLOP, GB accessed, temp) and, for the packed fwd+bwd, the
         gathers, sorts and scatters in the compiled HLO;
  trace  (not in the default) the CPU time of every thunk (fusion, dot, loop)
         of the compiled fwd+bwd, from jax.profiler traces taken alternately
         of the unpacked and the packed program, grouped by kind, opcodes
         inside, output shape and op_name (fusion names differ between the
         programs); the groups whose time differs most, and the packed
         program's largest fusions of [B, T, ...]-sized outputs with what they
         contain. Thunk times of a loop include its body's, so totals
         over-count; compare groups, not totals.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import timing, workloads
from benchmarks.packed import layout_summary

IMPLS = ("xla", "pallas")
SECTIONS = ("ops", "trace")
_KEY_OPS = ("gather", "select", "sort", "dot", "reduce", "concatenate", "slice", "pad",
            "transpose", "exponential", "while", "dynamic-slice", "dynamic-update-slice",
            "compare", "multiply", "add")


def median_interleaved(entries, repeats: int, settle: int = 1) -> dict:
    """entries: name -> (fn, args), timed round by round, each timed run after
    `settle` untimed runs of itself. Returns name -> (median, min, max) s."""
    times = {name: [] for name in entries}
    for _ in range(repeats):
        for name, (fn, args) in entries.items():
            for _ in range(settle):
                jax.block_until_ready(fn(*args))
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}


def print_times(res: dict) -> None:
    """One line per entry: median [min, max] in ms."""
    for name, (med, lo, hi) in res.items():
        print(f"   {name:<26}{med * 1e3:9.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}]")


def hlo_op_counts(compiled) -> str:
    """How many gathers, sorts, scatters, selects and loops the compiled HLO holds."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - not every backend has it
        return "no HLO text"
    counts = {op: len(re.findall(rf" {op}\(", text)) for op in
              ("gather", "sort", "scatter", "select", "while")}
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def compile_variants(op, mode, size, impls, chunk, ids_real) -> dict:
    """'IMPL VARIANT' -> (compiled, args) for the variants unpacked, packed and
    one-doc of each impl, printing each one's cost analysis."""
    args = workloads.device_inputs(op, size, jnp.float32, 0)
    variants = {"unpacked": (False, ids_real), "packed": (True, ids_real),
                "one-doc": (True, np.ones_like(ids_real))}
    entries = {}
    print(f"\n   {op} {mode}: {'GFLOP':>8}{'GB acc':>8}{'temp MiB':>10}")
    for impl in impls:
        for name, (packed, ids) in variants.items():
            # packed and one-doc: one program (the ids are data), compiled once
            full = args + [jnp.asarray(ids)]
            c, info = timing.compile_entry(op, impl, mode, size, jnp.float32, chunk, full,
                                           packed)
            entries[f"{impl} {name}"] = (c, full)
            extra = (f"   {hlo_op_counts(c)}" if name == "packed" and mode == "fwd+bwd"
                     else "")
            print(f"   {impl + ' ' + name:<22}{info.get('flops', 0) / 1e9:8.2f}"
                  f"{info.get('bytes_accessed', 0) / 1e9:8.2f}"
                  f"{info.get('temp_bytes', 0) / 2**20:10.1f}{extra}")
    return entries


def print_packed_ratios(res: dict, impls) -> None:
    """Per impl: packed / unpacked and one-doc / unpacked of the medians."""
    for impl in impls:
        base, packed = res[f"{impl} unpacked"], res[f"{impl} packed"]
        print(f"   => {impl}: packed / unpacked {packed[0] / base[0]:.3f}"
              f" (min {packed[1] / base[1]:.3f}), "
              f"one-doc / unpacked {res[f'{impl} one-doc'][0] / base[0]:.3f}; packed "
              f"extra {1e3 * (packed[0] - base[0]):.1f} ms")


def whole_ops(size, ops, impls, chunk, repeats, ids_real) -> None:
    """Section ops: every (op, mode), its variants timed interleaved."""
    for op in ops:
        for mode in workloads.MODES:
            entries = compile_variants(op, mode, size, impls, chunk, ids_real)
            res = median_interleaved(entries, repeats)
            print_times(res)
            print_packed_ratios(res, impls)
        timing.release_compiled()


def hlo_instructions(compiled) -> dict:
    """instruction name -> (kind, output shape, opcodes of its fused computation
    with counts, op_name) from the compiled HLO text."""
    text = compiled.as_text()
    blocks = {}
    for block in text.split("\n\n"):
        m = re.match(r"%?([\w.\-]+)", block.strip())
        if m:
            blocks[m.group(1)] = block
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (.+?) ([\w-]+)\(", line)
        if not m:
            continue
        name, shape, kind = m.groups()
        called = re.search(r"calls=%([\w.\-]+)", line)
        body = blocks.get(called.group(1), "") if called else ""
        ops = collections.Counter(o for o in re.findall(r" ([\w-]+)\(", body) if o in _KEY_OPS)
        op_name = re.search(r'op_name="([^"]*)"', line)
        out[name] = (kind, shape.split("{")[0], ops,
                     re.sub(r"jit\(\w+\)/", "", op_name.group(1) if op_name else ""))
    return out


def thunk_ms(compiled, args, runs: int) -> collections.Counter:
    """ms per run of every thunk (by instruction name), from a profiler trace."""
    from jax.profiler import ProfileData
    tmp = tempfile.mkdtemp(prefix="gdn-packed-trace-")
    try:
        jax.profiler.start_trace(tmp)
        for _ in range(runs):
            jax.block_until_ready(compiled(*args))
        jax.profiler.stop_trace()
        path = sorted(glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True))[-1]
        tot = collections.Counter()
        for plane in ProfileData.from_file(path).planes:
            if not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                if line.name == "python":
                    continue
                for ev in line.events:
                    if ev.name.startswith(("end: ", "Threadpool", "ThunkExecutor")):
                        continue
                    tot[ev.name] += ev.duration_ns / 1e6 / runs
        return tot
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _group_key(name: str, info: dict) -> str:
    """A thunk's group: kind[opcodes inside] output shape op_name (its tail)."""
    kind, shape, ops, op_name = info.get(name, ("?", "?", {}, ""))
    return f"{kind}[{','.join(sorted(ops))}] {shape} {op_name[-70:]}"


def print_group_diff(agg: dict, top: int) -> None:
    """The thunk groups whose ms per run grew most (and shrank most), unpacked -> packed."""
    keys = set(agg[False]) | set(agg[True])
    diff = sorted(((agg[True][k] - agg[False][k], k) for k in keys), reverse=True)
    for title, rows in (("largest increases:", diff[:top]), ("largest decreases:", diff[-5:])):
        print(f"   {title}")
        for d, k in rows:
            print(f"   {d:+8.1f}  {agg[False][k]:7.1f} -> {agg[True][k]:7.1f}  {k}")


def trace_diff(size, op, impl, chunk, repeats, ids_real, top=20) -> None:
    """Section trace: thunk times of the unpacked and the packed fwd+bwd of one
    (op, impl), traced alternately, grouped and compared."""
    args = workloads.device_inputs(op, size, jnp.float32, 0) + [jnp.asarray(ids_real)]
    progs, totals, infos = {}, {}, {}
    for packed in (False, True):
        c, _ = timing.compile_entry(op, impl, "fwd+bwd", size, jnp.float32, chunk, args, packed)
        jax.block_until_ready(c(*args))
        progs[packed], totals[packed] = c, collections.Counter()
        infos[packed] = hlo_instructions(c)
    n = max(1, repeats // 2)
    for _ in range(n):                              # alternate: drift hits both alike
        for packed in (False, True):
            totals[packed].update(thunk_ms(progs[packed], args, 2))
    agg = {packed: collections.Counter() for packed in (False, True)}
    for packed in (False, True):
        for name, ms in totals[packed].items():
            agg[packed][_group_key(name, infos[packed])] += ms / n
    print(f"\n   {op} {impl} fwd+bwd: thunk ms per run, unpacked -> packed "
          f"(sum {sum(agg[False].values()):.0f} -> {sum(agg[True].values()):.0f}, loops "
          "counted with their bodies)")
    print_group_diff(agg, top)
    bt = f"[{size.B},{size.T},"
    big = sorted(((ms / n, name) for name, ms in totals[True].items()
                  if bt in infos[True].get(name, ("", "", {}, ""))[1]), reverse=True)[:6]
    print(f"   packed program, largest thunks with a {bt}...] output:")
    for ms, name in big:
        kind, shape, ops, op_name = infos[True][name]
        print(f"   {ms:8.1f}  {name} {shape} {dict(ops)}  {op_name[-60:]}")
    timing.release_compiled()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_packed",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="bench-d128,2,4096", metavar="LAYOUT,B,T")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--ops", nargs="+", default=list(workloads.OPS), choices=workloads.OPS)
    ap.add_argument("--sections", nargs="+", default=["ops"], choices=SECTIONS)
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    size = workloads.parse_size(args.size)
    chunk = args.chunk_size
    ids = workloads.packed_segment_ids(size.B, size.T, chunk, 0)
    print(f"{size.label}, chunk {chunk}, {jax.devices()[0].device_kind}, pallas mode "
          f"{timing.interpret_mode('pallas')}, load {os.getloadavg()[0]:.2f}\n"
          f"packing: {layout_summary(size, chunk, 0)['text']}")
    print(f"timings: interleaved, each run after one untimed run of itself, {args.repeats} "
          "runs: median [min, max] ms")
    if "ops" in args.sections:
        print("\nops: whole ops (public API)")
        whole_ops(size, args.ops, args.impls, chunk, args.repeats, ids)
    if "trace" in args.sections:
        print("\ntrace: thunk times from profiler traces (alternating unpacked / packed)")
        for op in args.ops:
            for impl in args.impls:
                trace_diff(size, op, impl, chunk, args.repeats, ids)
    print(f"\nload {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
