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
     glue, no zero_padding) with and without Segments.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

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
    dy = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape, np.float32))
    entries = {
        "Segments+ConvWindows": (j_seg, (ids,)),
        "from_ids alone": (jax.jit(segments.from_ids), (ids,)),
        "to_compact (gather)": (jax.jit(segments.to_compact), (x, win, seg.pad)),
        "from_compact (gather)": (jax.jit(segments.from_compact), (x, win, seg.pad)),
        "zero_padding [B,T,Hv,Dv]": (jax.jit(segments.zero_padding), (seg.pad, do)),
        "conv fwd unpacked": (jax.jit(lambda x, w: mixer_mod._conv_forward(x, w, None, None)),
                              (x, w)),
        "conv fwd packed": (jax.jit(mixer_mod._conv_forward), (x, w, seg, win)),
        "conv bwd unpacked": (jax.jit(lambda x, w, p, d: mixer_mod._conv_backward(
            x, w, p, d, None, None)), (x, w, pre, dy)),
        "conv bwd packed": (jax.jit(mixer_mod._conv_backward), (x, w, pre, dy, seg, win)),
        "prologue unpacked": (jax.jit(lambda *p: mixer_mod.prologue(cfg, *p)),
                              (x, w, a, b, a_log, dt_bias)),
        "prologue packed (+windows)": (jax.jit(lambda x, w, a, b, al, dt, i: mixer_mod.prologue(
            cfg, x, w, a, b, al, dt, segments.from_ids(i),
            segments.conv_windows(segments.from_ids(i), width))),
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_packed")
    ap.add_argument("--size", default="bench-d128,2,4096", metavar="LAYOUT,B,T")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--impls", nargs="+", default=["xla", "pallas"], choices=("xla", "pallas"))
    ap.add_argument("--sections", nargs="+", type=int, default=[1, 2, 3], choices=(1, 2, 3))
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
    print(f"\nload {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
