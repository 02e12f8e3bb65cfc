"""Where the time of the chunked XLA path goes: the hand-written VJP
(impl="xla") against jax.grad through the same forward (xla-autodiff), and
the forward and backward split into their stages.

  python -m benchmarks.profile_vjp [--size LAYOUT,B,T] [--repeats N] [--order-effect]

Prints, for gated_delta_rule at one size (default the acceptance size):
  1. XLA cost analysis (flops, bytes accessed) and compiled temp memory of
     xla fwd, xla fwd+bwd, xla-autodiff fwd+bwd;
  2. interleaved, settled medians of xla vs xla-autodiff fwd+bwd;
  3. xla_impl.forward by stage, each jitted alone (ms and us/token): one
     super-block's slice to the chunk layout (block_inputs), its chunk_intra
     (decay, inverse, WY factors), state pass (inner scan) and outputs;
     a block stage's share of the whole is its time times the block count
  4. xla_impl.backward by stage on one super-block: the backward terms
     (decay factors, and the dS1-independent cotangent terms from the
     forward's residuals), the cotangent pass (inner reverse scan),
     chunk_backward
  5. with --order-effect: the xla fwd+bwd timed right after its own run and
     right after a reference fwd+bwd run (why timing.py settles each run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from gdn_kernels import chunk_math as cm
from gdn_kernels import layout, xla_impl

from . import timing, workloads


def _median_interleaved(entries, repeats, settle=1):
    """entries: name -> (fn, args). Returns name -> (median, min, max) s."""
    times = {name: [] for name in entries}
    for _ in range(repeats):
        for name, (fn, args) in entries.items():
            for _ in range(settle):
                jax.block_until_ready(fn(*args))
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}


def _print_times(res, tokens=None):
    for name, (med, lo, hi) in res.items():
        per_token = f"  {med / tokens * 1e6:7.1f} us/token" if tokens else ""
        print(f"   {name:<26}{med * 1e3:9.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}]{per_token}")


def _flops(fn, args) -> str:
    try:
        ca = fn.lower(*args).compile().cost_analysis()
        ca = ca[0] if isinstance(ca, (list, tuple)) else ca
        return f"{ca.get('flops', 0) / 1e9:9.2f} GFLOP"
    except Exception as err:  # noqa: BLE001 - not every backend has it
        return f"no cost analysis ({err})"


def _first_block(blocks):
    """The first super-block of a pytree stacked by the scan ([NB, ...] leaves -> [...])."""
    return jax.tree.map(lambda x: x[0], blocks)


def forward_stages(q, k, v, g, beta, s0, scale, chunk):
    """xla_impl.forward's stages, jitted, with their arguments: name -> (fn,
    args). The per-block stages run on the first super-block; times them the
    block count (xla_impl.SUPER_BLOCK chunks a block) is their share."""
    padded = xla_impl.pad_inputs(q, k, v, g, beta, None, chunk)
    zero = jnp.int32(0)
    j_layout = jax.jit(lambda i: xla_impl.block_inputs(padded, i))
    blk = jax.block_until_ready(j_layout(zero))
    j_intra = jax.jit(lambda b: xla_impl._vmap_n(cm.chunk_intra, 3)(b.k, b.v, b.g, b.beta,
                                                                    b.seg))
    intra = jax.block_until_ready(j_intra(blk))
    j_state = jax.jit(xla_impl.state_pass)
    _, states, new_values = jax.block_until_ready(j_state(s0, blk.k, intra))
    def outputs(b, st, e, dec):
        p = xla_impl._vmap_n(cm.chunk_attention, 3)(b.q, b.k, dec)
        o = xla_impl._vmap_n(cm.chunk_output, 3, in_axes=(0, 0, 0, 0, 0, None))(
            b.q, st, e, p, dec, scale)
        return layout.block_to_rows(o)
    j_out = jax.jit(outputs)
    return {"block: slice (block_inputs)": (j_layout, (zero,)),
            "block: chunk_intra": (j_intra, (blk,)),
            "block: state pass": (j_state, (s0, blk.k, intra)),
            "block: outputs": (j_out, (blk, states, new_values, intra.dec))}


def backward_stages(q, k, v, g, beta, res, do, ds_final, scale, chunk):
    """xla_impl.backward's stages on the last super-block (the first the
    backward visits), jitted, with their arguments: name -> (fn, args)."""
    padded = xla_impl.pad_inputs(q, k, v, g, beta, None, chunk)
    last = jnp.int32(padded.num_blocks - 1)
    do = layout.pad_time(do, chunk * padded.per_block)
    blk = jax.jit(lambda i: xla_impl.block_inputs(padded, i))(last)
    do0 = jax.jit(lambda i: layout.block_at(do, i, chunk, padded.per_block, padded.acc))(last)
    res0 = jax.tree.map(lambda x: x[-1], res)
    j_terms = jax.jit(lambda b, r, d: xla_impl._vmap_n(
        xla_impl._backward_terms, 3, in_axes=(0,) * 5 + (None,))(b.q, b.g, b.seg, r, d, scale))
    bwd = jax.block_until_ready(j_terms(blk, res0, do0))
    ds1 = ds_final.astype(padded.acc)
    j_pass = jax.jit(xla_impl.cotangent_pass)
    _, ds_ends, d_new = jax.block_until_ready(j_pass(ds1, blk.k, bwd))
    j_chunks = jax.jit(lambda b, r, d, e, dn, bw: xla_impl.grads_to_rows(xla_impl._vmap_n(
        cm.chunk_backward, 3, in_axes=(0,) * 10 + (None,))(
        b.q, b.k, b.v, b.beta, r.states, r.new_values, d, e, dn, bw, scale), padded.group))
    return {"block: backward terms": (j_terms, (blk, res0, do0)),
            "block: cotangent pass": (j_pass, (ds1, blk.k, bwd)),
            "block: chunk_backward": (j_chunks, (blk, res0, do0, ds_ends, d_new, bwd))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_vjp")
    ap.add_argument("--size", default="bench-d128,2,4096", metavar="LAYOUT,B,T",
                    help="LAYOUT,B,T or B,T,Hk,Hv,D[,Dv] (default: the acceptance size)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--order-effect", action="store_true")
    args = ap.parse_args(argv)
    size = workloads.parse_size(args.size)
    chunk, scale = args.chunk_size, float(size.Dk ** -0.5)
    print(f"{size.label}, chunk {chunk}, {jax.devices()[0].device_kind}, "
          f"load {os.getloadavg()[0]:.2f}")

    arrs = workloads.device_inputs("delta_rule", size, jnp.float32, 0)
    q, k, v, g, beta, co, cs = arrs
    compiled = {}
    print("\n1. cost analysis (fwd+bwd = grad of sum(o*co) + sum(S_T*cs))")
    print(f"{'entry':<22}{'GFLOP':>9}{'GB accessed':>13}{'temp MiB':>10}")
    for impl, mode in (("xla", "fwd"), ("xla", "fwd+bwd"), ("xla-autodiff", "fwd+bwd")):
        c, info = timing.compile_entry("delta_rule", impl, mode, size, jnp.float32, chunk, arrs)
        compiled[f"{impl} {mode}"] = c
        print(f"{impl + ' ' + mode:<22}{info.get('flops', 0) / 1e9:9.2f}"
              f"{info.get('bytes_accessed', 0) / 1e9:13.2f}{info['temp_bytes'] / 2**20:10.1f}")
    print("   (flops of while/scan bodies are counted once per loop by XLA's cost analysis,"
          " not per iteration)")

    print(f"\n2. interleaved, settled, {args.repeats} runs: median [min, max] ms")
    res = _median_interleaved({name: (c, arrs) for name, c in compiled.items()}, args.repeats)
    _print_times(res)
    fwd_t = res["xla fwd"][0]
    print(f"   => backward alone: xla {1e3 * (res['xla fwd+bwd'][0] - fwd_t):.1f} ms, "
          f"autodiff {1e3 * (res['xla-autodiff fwd+bwd'][0] - fwd_t):.1f} ms "
          "(fwd+bwd minus fwd)")

    tokens = size.B * size.T
    s0 = jnp.zeros((size.B, size.Hv, size.Dk, size.Dv), jnp.float32)
    n_blocks, _ = layout.blocks_of(size.T, chunk, xla_impl.SUPER_BLOCK)
    print(f"\n3. xla_impl.forward by stage (each jitted alone; {n_blocks} super-blocks), "
          "ms and us per token")
    fwd_entries = {"full xla_impl.forward": (
        jax.jit(lambda *a: xla_impl.forward(*a, scale, chunk)), (q, k, v, g, beta, s0))}
    fwd_entries.update(forward_stages(q, k, v, g, beta, s0, scale, chunk))
    _print_times(_median_interleaved(fwd_entries, args.repeats), tokens)

    print("\n4. xla_impl.backward by stage (each jitted alone)")
    _, _, resid = jax.block_until_ready(fwd_entries["full xla_impl.forward"][0](
        q, k, v, g, beta, s0))
    bwd_entries = {"full xla_impl.backward": (
        jax.jit(lambda *a: xla_impl.backward(*a, scale, chunk)),
        (q, k, v, g, beta, resid, co, cs))}
    bwd_entries.update(backward_stages(q, k, v, g, beta, resid, co, cs, scale, chunk))
    _print_times(_median_interleaved(bwd_entries, args.repeats), tokens)
    for name in ("block: backward terms", "block: chunk_backward"):
        fn, a = bwd_entries[name]
        print(f"   {name:<26}{_flops(fn, a)}")

    if args.order_effect:
        print("\n5. order effect: xla fwd+bwd after its own run vs after a reference run")
        ref, _ = timing.compile_entry("delta_rule", "reference", "fwd+bwd", size, jnp.float32,
                                      chunk, arrs)
        xla = compiled["xla fwd+bwd"]
        after_self, after_ref = [], []
        for _ in range(max(3, args.repeats // 2)):
            jax.block_until_ready(xla(*arrs))
            after_self.append(timing.time_once(xla, arrs))
            jax.block_until_ready(ref(*arrs))
            after_ref.append(timing.time_once(xla, arrs))
        for name, ts in (("after itself", after_self), ("after reference", after_ref)):
            print(f"   {name:<18}{statistics.median(ts) * 1e3:9.1f} ms "
                  f"[{min(ts) * 1e3:.1f}, {max(ts) * 1e3:.1f}]")
    print(f"\nload {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
