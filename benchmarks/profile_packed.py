"""Where the extra time of packed sequences (segment_ids) goes.

  python -m benchmarks.profile_packed [--size LAYOUT,B,T] [--repeats N]
                                      [--impls xla pallas] [--sections 1 2 3]

At one size (default the acceptance size), with the packing of
workloads.packed_layout, every timing interleaved and settled (as
profile_vjp):
  1. whole ops, per op and impl, fwd and fwd+bwd: unpacked (segment_ids=None),
     packed, and "one-doc" (segment_ids all 1: the packed code path without
     any document boundary or padding); cost analysis (GFLOP, GB accessed,
     temp) and, for the packed fwd+bwd, the gathers, sorts and scatters in the
     compiled HLO;
  2. the mixer's conv and gate prologue alone: Segments + ConvWindows from the
     ids (from_ids, argsort), to_compact / from_compact (the take_along_axis
     gathers of [B, T, C]), the conv forward and backward unpacked / packed
     (mixer._conv_forward, _conv_backward), zero_padding of one [B, T, Hv, Dv]
     array, and the whole prologue unpacked / packed;
  3. the chunked backends alone (backend forward, backward; no custom VJP
     glue, no zero_padding) with and without Segments;
  4. (--sections 4, --trace-op, --trace-impl) the CPU time of every thunk
     (fusion, dot, loop) of the compiled fwd+bwd, from jax.profiler traces
     taken alternately of the unpacked and the packed program, grouped by
     kind, opcodes inside, output shape and op_name (fusion names differ
     between the programs); the groups whose time differs most, and the
     packed program's largest fusions of [B, T, C]-sized outputs with what
     they contain. Thunk times of a loop include its body's, so totals
     over-count; compare groups, not totals.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from gdn_kernels import conv1d, segments
from gdn_kernels import mixer as mixer_mod
from gdn_kernels.backends import get_backend
from gdn_kernels.l2norm import DEFAULT_EPS

from . import timing, workloads
from .profile_vjp import _median_interleaved, _print_times


def _hlo_counts(compiled) -> str:
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001
        return "no HLO text"
    counts = {op: len(re.findall(rf" {op}\(", text)) for op in
              ("gather", "sort", "scatter", "select", "while")}
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def _whole_ops(size, impls, chunk, repeats, ids_real):
    ids_one = np.ones_like(ids_real)
    for op in workloads.OPS:
        args = workloads.device_inputs(op, size, jnp.float32, 0)
        variants = {"unpacked": (False, ids_real), "packed": (True, ids_real),
                    "one-doc": (True, ids_one)}
        for mode in ("fwd", "fwd+bwd"):
            entries = {}
            print(f"\n   {op} {mode}: {'GFLOP':>8}{'GB acc':>8}{'temp MiB':>10}")
            for impl in impls:
                for name, (packed, ids) in variants.items():
                    # packed and one-doc: one program (the ids are data), compiled once
                    c, info = timing.compile_entry(op, impl, mode, size, jnp.float32, chunk,
                                                   args + [jnp.asarray(ids)], packed)
                    key = f"{impl} {name}"
                    entries[key] = (c, args + [jnp.asarray(ids)])
                    extra = (f"   {_hlo_counts(c)}" if name == "packed" and mode == "fwd+bwd"
                             else "")
                    print(f"   {key:<22}{info.get('flops', 0) / 1e9:8.2f}"
                          f"{info.get('bytes_accessed', 0) / 1e9:8.2f}"
                          f"{info.get('temp_bytes', 0) / 2**20:10.1f}{extra}")
            res = _median_interleaved(entries, repeats)
            _print_times(res)
            for impl in impls:
                base = res[f"{impl} unpacked"][0]
                print(f"   => {impl}: packed / unpacked {res[f'{impl} packed'][0] / base:.3f}"
                      f" (min {res[f'{impl} packed'][1] / res[f'{impl} unpacked'][1]:.3f}), "
                      f"one-doc / unpacked {res[f'{impl} one-doc'][0] / base:.3f}; packed "
                      f"extra {1e3 * (res[f'{impl} packed'][0] - base):.1f} ms")
        timing.release_compiled()


def _mixer_pieces(size, chunk, repeats, ids_real):
    x, w, a, b, a_log, dt_bias, do = workloads.device_inputs("mixer", size, jnp.float32, 0)
    ids = jnp.asarray(ids_real)
    cfg = mixer_mod.MixerConfig(impl="xla", num_k_heads=size.Hk, num_v_heads=size.Hv,
                                head_k_dim=size.Dk, head_v_dim=size.Dv, use_qk_norm=True,
                                eps=float(DEFAULT_EPS), scale=float(size.Dk ** -0.5),
                                chunk_size=chunk)
    width = w.shape[0]
    j_seg = jax.jit(lambda i: segments.conv_windows(segments.from_ids(i), width))
    seg = jax.block_until_ready(jax.jit(segments.from_ids)(ids))
    win = jax.block_until_ready(j_seg(ids))
    _, pre = conv1d.conv1d_silu_forward(x, w)
    hist = jnp.zeros((x.shape[0], width - 1, x.shape[2]), x.dtype)   # no carried state
    dy = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape, np.float32))
    entries = {
        "Segments+ConvWindows": (j_seg, (ids,)),
        "from_ids alone": (jax.jit(segments.from_ids), (ids,)),
        "to_compact (gather)": (jax.jit(segments.to_compact), (x, win, seg.pad)),
        "from_compact (gather)": (jax.jit(segments.from_compact), (x, win, seg.pad)),
        "zero_padding [B,T,Hv,Dv]": (jax.jit(segments.zero_padding), (seg.pad, do)),
        "conv fwd unpacked": (jax.jit(lambda x, w: mixer_mod._conv_forward(
            mixer_mod._extended_input(x, hist, None, None), w, None, None)), (x, w)),
        "conv fwd packed": (jax.jit(lambda x, w, seg, win: mixer_mod._conv_forward(
            mixer_mod._extended_input(x, hist, seg, win), w, seg, win)), (x, w, seg, win)),
        "conv bwd unpacked": (jax.jit(lambda x, w, p, d: mixer_mod._conv_backward(
            mixer_mod._extended_input(x, hist, None, None), w, p, d, hist, None, None)),
            (x, w, pre, dy)),
        "conv bwd packed": (jax.jit(lambda x, w, p, d, seg, win: mixer_mod._conv_backward(
            mixer_mod._extended_input(x, hist, seg, win), w, p, d, hist, seg, win)),
            (x, w, pre, dy, seg, win)),
        "prologue unpacked": (jax.jit(lambda *p: mixer_mod.prologue_of(cfg, *p)),
                              (x, w, a, b, a_log, dt_bias)),
        "prologue packed (+windows)": (jax.jit(lambda x, w, a, b, al, dt, i: mixer_mod.prologue_of(
            cfg, x, w, a, b, al, dt, segments.from_ids(i))),
            (x, w, a, b, a_log, dt_bias, ids)),
    }
    _print_times(_median_interleaved(entries, repeats))


def _backends(size, impls, chunk, repeats, ids_real):
    q, k, v, g, beta, co, cs = workloads.device_inputs("delta_rule", size, jnp.float32, 0)
    seg = jax.block_until_ready(jax.jit(segments.from_ids)(jnp.asarray(ids_real)))
    q, k, v, g, beta = segments.zero_padding_all(seg, q, k, v, g, beta)
    s0 = jnp.zeros((size.B, size.Hv, size.Dk, size.Dv), jnp.float32)
    scale = float(size.Dk ** -0.5)
    entries = {}
    for impl in impls:
        be = get_backend(impl)
        for name, sg in (("unpacked", None), ("packed", seg)):
            fwd = jax.jit(lambda q, k, v, g, beta, s0, sg, be=be: be.forward(
                q, k, v, g, beta, s0, scale, chunk, sg))
            _, _, res = jax.block_until_ready(fwd(q, k, v, g, beta, s0, sg))
            bwd = jax.jit(lambda q, k, v, g, beta, res, co, cs, sg, be=be: be.backward(
                q, k, v, g, beta, res, co, cs, scale, chunk, sg))
            entries[f"{impl} forward {name}"] = (fwd, (q, k, v, g, beta, s0, sg))
            entries[f"{impl} backward {name}"] = (bwd, (q, k, v, g, beta, res, co, cs, sg))
    res = _median_interleaved(entries, repeats)
    _print_times(res)
    for impl in impls:
        for part in ("forward", "backward"):
            u, p = res[f"{impl} {part} unpacked"], res[f"{impl} {part} packed"]
            print(f"   => {impl} {part}: packed / unpacked {p[0] / u[0]:.3f} "
                  f"(min {p[1] / u[1]:.3f}), extra {1e3 * (p[0] - u[0]):.1f} ms")


_KEY_OPS = ("gather", "select", "sort", "dot", "reduce", "concatenate", "slice", "pad",
            "transpose", "exponential", "while", "dynamic-slice", "dynamic-update-slice",
            "compare", "multiply", "add")


def _hlo_instructions(compiled) -> dict:
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


def _thunk_ms(compiled, args, runs: int) -> collections.Counter:
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


def _trace_diff(size, op, impl, chunk, repeats, ids_real, top=20):
    args = workloads.device_inputs(op, size, jnp.float32, 0) + [jnp.asarray(ids_real)]
    progs, totals, infos = {}, {}, {}
    for packed in (False, True):
        c, _ = timing.compile_entry(op, impl, "fwd+bwd", size, jnp.float32, chunk, args, packed)
        jax.block_until_ready(c(*args))
        progs[packed], totals[packed] = c, collections.Counter()
        infos[packed] = _hlo_instructions(c)
    for _ in range(max(1, repeats // 2)):          # alternate: drift hits both alike
        for packed in (False, True):
            totals[packed].update(_thunk_ms(progs[packed], args, 2))
    n = max(1, repeats // 2)

    def group(name, info):
        kind, shape, ops, op_name = info.get(name, ("?", "?", {}, ""))
        return f"{kind}[{','.join(sorted(ops))}] {shape} {op_name[-70:]}"

    agg = {}
    for packed in (False, True):
        agg[packed] = collections.Counter()
        for name, ms in totals[packed].items():
            agg[packed][group(name, infos[packed])] += ms / n
    keys = set(agg[False]) | set(agg[True])
    diff = sorted(((agg[True][k] - agg[False][k], k) for k in keys), reverse=True)
    print(f"\n   {op} {impl} fwd+bwd: thunk ms per run, unpacked -> packed "
          f"(sum {sum(agg[False].values()):.0f} -> {sum(agg[True].values()):.0f}, loops "
          "counted with their bodies)")
    print("   largest increases:")
    for d, k in diff[:top]:
        print(f"   {d:+8.1f}  {agg[False][k]:7.1f} -> {agg[True][k]:7.1f}  {k}")
    print("   largest decreases:")
    for d, k in diff[-5:]:
        print(f"   {d:+8.1f}  {agg[False][k]:7.1f} -> {agg[True][k]:7.1f}  {k}")
    bt = f"[{size.B},{size.T},"
    big = sorted(((ms / n, name) for name, ms in totals[True].items()
                  if bt in infos[True].get(name, ("", "", {}, ""))[1]), reverse=True)[:6]
    print(f"   packed program, largest thunks with a {bt}...] output:")
    for ms, name in big:
        kind, shape, ops, op_name = infos[True][name]
        print(f"   {ms:8.1f}  {name} {shape} {dict(ops)}  {op_name[-60:]}")
    timing.release_compiled()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_packed")
    ap.add_argument("--size", default="bench-d128,2,4096", metavar="LAYOUT,B,T")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--impls", nargs="+", default=["xla", "pallas"], choices=("xla", "pallas"))
    ap.add_argument("--sections", nargs="+", type=int, default=[1, 2, 3], choices=(1, 2, 3, 4))
    ap.add_argument("--trace-op", nargs="+", default=["mixer"], choices=workloads.OPS)
    ap.add_argument("--trace-impl", nargs="+", default=None, choices=("xla", "pallas"),
                    help="section 4's impls (default: --impls)")
    args = ap.parse_args(argv)
    size = workloads.parse_size(args.size)
    chunk = args.chunk_size
    ids = workloads.packed_segment_ids(size.B, size.T, chunk, 0)
    from .packed import layout_summary
    print(f"{size.label}, chunk {chunk}, {jax.devices()[0].device_kind}, pallas mode "
          f"{timing.interpret_mode('pallas')}, load {os.getloadavg()[0]:.2f}\n"
          f"packing: {layout_summary(size, chunk, 0)['text']}")
    print(f"timings: interleaved, each run after one untimed run of itself, {args.repeats} "
          "runs: median [min, max] ms")
    if 1 in args.sections:
        print("\n1. whole ops (public API)")
        _whole_ops(size, args.impls, chunk, args.repeats, ids)
    if 2 in args.sections:
        print("\n2. mixer prologue pieces (x [B, T, C], C = "
              f"{size.channels}), each jitted alone")
        _mixer_pieces(size, chunk, args.repeats, ids)
    if 3 in args.sections:
        print("\n3. chunked backends alone (inputs already zeroed at padding)")
        _backends(size, args.impls, chunk, args.repeats, ids)
    if 4 in args.sections:
        print("\n4. thunk times from profiler traces (alternating unpacked / packed)")
        for op in args.trace_op:
            for impl in args.trace_impl or args.impls:
                _trace_diff(size, op, impl, chunk, args.repeats, ids)
    print(f"\nload {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
