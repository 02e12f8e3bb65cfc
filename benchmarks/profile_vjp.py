"""Where the time of the chunked XLA fwd+bwd goes: the hand-written VJP
(impl="xla") against jax.grad through the same forward (xla-autodiff).

  python -m benchmarks.profile_vjp [--size B,T,Hk,Hv,D] [--repeats N] [--order-effect]

Prints, for gated_delta_rule at one size (default the acceptance size):
  1. XLA cost analysis (flops, bytes accessed) and compiled temp memory of
     xla fwd, xla fwd+bwd, xla-autodiff fwd+bwd;
  2. interleaved, settled medians of xla vs xla-autodiff fwd+bwd;
  3. the hand-written backward (xla_impl.backward) split into its stages,
     each jitted alone on the forward's residuals:
       prep    chunked layout, chunk_decay, chunk_wy_factors, chunk_attention,
               chunk_cotangent_terms (vmapped over all chunks)
       scan    the reverse scan carrying dS (chunk_state_cotangent_step)
       chunks  chunk_backward vmapped over all chunks (recomputes decay, WY
               factors, attention, cotangent terms and the dS step itself)
       layout  from_chunks / sum_head_groups of the gradients
     and the autodiff backward (fwd+bwd minus fwd);
  4. with --order-effect: the xla fwd+bwd timed right after its own run and
     right after a reference fwd+bwd run (why runner.py settles each run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

from gdn_kernels import chunk_math as cm
from gdn_kernels import layout, xla_impl

from . import runner, workloads


def _median_interleaved(fns, args_list, repeats, settle=1):
    times = {name: [] for name in fns}
    for r in range(repeats):
        for name in fns:
            for _ in range(settle):
                jax.block_until_ready(fns[name](*args_list[name]))
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](*args_list[name]))
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}


def _vmap_n(fn, depth, in_axes=0):
    for _ in range(depth):
        fn = jax.vmap(fn, in_axes=in_axes)
    return fn


def backward_stages(chunk, scale):
    """The stages of xla_impl.backward as separately jittable functions
    (same code, cut at the stage boundaries)."""

    def prep(q, k, v, g, beta, tinv, do):
        acc = jnp.float32
        qc, kc, vc, gc, bc = xla_impl._chunked_inputs(q, k, v, g, beta, chunk, acc)
        doc = layout.to_chunks(do, chunk, acc)
        dec = _vmap_n(cm.chunk_decay, 3)(gc)
        intra = _vmap_n(cm.chunk_wy_factors, 3)(kc, vc, bc, dec, tinv)
        p = _vmap_n(cm.chunk_attention, 3)(qc, kc, dec)
        terms = _vmap_n(cm.chunk_cotangent_terms, 3, in_axes=(0, 0, 0, 0, None))(
            qc, p, doc, dec, scale)
        return qc, kc, vc, gc, bc, doc, intra, terms

    def scan(kc, intra, terms, ds_final):
        def step(ds1, xs):
            k_n, intra_n, terms_n = xs
            _, ds0 = _vmap_n(cm.chunk_state_cotangent_step, 2)(ds1, k_n, intra_n, terms_n)
            return ds0, ds1
        return lax.scan(step, ds_final, (kc, intra, terms), reverse=True)

    def chunks(qc, kc, vc, gc, bc, states, tinv, doc, ds_ends):
        return _vmap_n(cm.chunk_backward, 3, in_axes=(0, 0, 0, 0, 0, 0, 0, 0, 0, None))(
            qc, kc, vc, gc, bc, states, tinv, doc, ds_ends, scale)

    def finish(grads, t, group):
        dq = layout.sum_head_groups(layout.from_chunks(grads.dq, t), group)
        dk = layout.sum_head_groups(layout.from_chunks(grads.dk, t), group)
        return (dq, dk, layout.from_chunks(grads.dv, t),
                layout.scalars_from_chunks(grads.dg, t),
                layout.scalars_from_chunks(grads.dbeta, t))

    return prep, scan, chunks, finish


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_vjp")
    ap.add_argument("--size", default="2,4096,2,4,128")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--order-effect", action="store_true")
    args = ap.parse_args(argv)
    size = workloads.parse_size(args.size)
    chunk, scale = args.chunk_size, float(size.Dk ** -0.5)
    import os
    print(f"{size.label}, chunk {chunk}, {jax.devices()[0].device_kind}, "
          f"load {os.getloadavg()[0]:.2f}")

    arrs = workloads.device_inputs("delta_rule", size, jnp.float32, 0)
    q, k, v, g, beta, co, cs = arrs
    compiled = {}
    print("\n1. cost analysis (fwd+bwd = grad of sum(o*co) + sum(S_T*cs))")
    print(f"{'entry':<22}{'GFLOP':>9}{'GB accessed':>13}{'temp MiB':>10}")
    for impl, mode in (("xla", "fwd"), ("xla", "fwd+bwd"), ("xla-autodiff", "fwd+bwd")):
        c, info = runner.compile_entry("delta_rule", impl, mode, size, jnp.float32, chunk, arrs)
        compiled[(impl, mode)] = c
        print(f"{impl + ' ' + mode:<22}{info.get('flops', 0) / 1e9:9.2f}"
              f"{info.get('bytes_accessed', 0) / 1e9:13.2f}{info['temp_bytes'] / 2**20:10.1f}")
    print("   (flops of while/scan bodies are counted once per loop by XLA's cost analysis,"
          " not per iteration)")

    print(f"\n2. interleaved, settled, {args.repeats} runs: median [min, max] ms")
    res = _median_interleaved(
        {"xla fwd+bwd": compiled[("xla", "fwd+bwd")],
         "xla-autodiff fwd+bwd": compiled[("xla-autodiff", "fwd+bwd")],
         "xla fwd": compiled[("xla", "fwd")]},
        {"xla fwd+bwd": arrs, "xla-autodiff fwd+bwd": arrs, "xla fwd": arrs}, args.repeats)
    for name, (med, lo, hi) in res.items():
        print(f"   {name:<22}{med * 1e3:9.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}]")
    fwd_t = res["xla fwd"][0]
    print(f"   => backward alone: xla {1e3 * (res['xla fwd+bwd'][0] - fwd_t):.1f} ms, "
          f"autodiff {1e3 * (res['xla-autodiff fwd+bwd'][0] - fwd_t):.1f} ms "
          "(fwd+bwd minus fwd)")

    print("\n3. the hand-written backward by stage (each jitted alone)")
    s0 = jnp.zeros((size.B, size.Hv, size.Dk, size.Dv), jnp.float32)
    fwd = jax.jit(lambda *a: xla_impl.forward(*a, scale, chunk))
    o, s_fin, resid = jax.block_until_ready(fwd(q, k, v, g, beta, s0))
    prep, scan, chunks, finish = backward_stages(chunk, scale)
    j_prep, j_scan, j_chunks = jax.jit(prep), jax.jit(scan), jax.jit(chunks)
    j_finish = jax.jit(finish, static_argnums=(1, 2))
    j_full = jax.jit(lambda *a: xla_impl.backward(*a, scale, chunk))
    qc, kc, vc, gc, bc, doc, intra, terms = jax.block_until_ready(
        j_prep(q, k, v, g, beta, resid.tinv, co))
    ds_init, ds_ends = jax.block_until_ready(j_scan(kc, intra, terms, cs))
    grads = jax.block_until_ready(j_chunks(qc, kc, vc, gc, bc, resid.states, resid.tinv,
                                           doc, ds_ends))
    group = size.Hv // size.Hk
    stage_fns = {
        "full xla_impl.backward": (j_full, (q, k, v, g, beta, resid, co, cs)),
        "prep": (j_prep, (q, k, v, g, beta, resid.tinv, co)),
        "scan": (j_scan, (kc, intra, terms, cs)),
        "chunks (chunk_backward)": (j_chunks, (qc, kc, vc, gc, bc, resid.states, resid.tinv,
                                               doc, ds_ends)),
        "layout": (lambda gr: j_finish(gr, size.T, group), (grads,)),
    }
    res = _median_interleaved({k_: f for k_, (f, _) in stage_fns.items()},
                              {k_: a for k_, (_, a) in stage_fns.items()}, args.repeats)
    for name, (med, lo, hi) in res.items():
        print(f"   {name:<26}{med * 1e3:9.1f} [{lo * 1e3:.1f}, {hi * 1e3:.1f}]")
    for name, (fn, a) in stage_fns.items():
        if name in ("prep", "chunks (chunk_backward)"):
            try:
                ca = fn.lower(*a).compile().cost_analysis()
                ca = ca[0] if isinstance(ca, (list, tuple)) else ca
                print(f"   {name:<26}{ca.get('flops', 0) / 1e9:9.2f} GFLOP")
            except Exception as err:  # noqa: BLE001
                print(f"   {name}: no cost analysis ({err})")

    if args.order_effect:
        print(f"\n4. order effect: xla fwd+bwd after its own run vs after a reference run")
        ref, _ = runner.compile_entry("delta_rule", "reference", "fwd+bwd", size, jnp.float32,
                                      chunk, arrs)
        xla = compiled[("xla", "fwd+bwd")]
        after_self, after_ref = [], []
        for _ in range(max(3, args.repeats // 2)):
            jax.block_until_ready(xla(*arrs))
            after_self.append(runner.time_once(xla, arrs))
            jax.block_until_ready(ref(*arrs))
            after_ref.append(runner.time_once(xla, arrs))
        for name, ts in (("after itself", after_self), ("after reference", after_ref)):
            print(f"   {name:<18}{statistics.median(ts) * 1e3:9.1f} ms "
                  f"[{min(ts) * 1e3:.1f}, {max(ts) * 1e3:.1f}]")
    print(f"\nload {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
