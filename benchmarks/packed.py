"""Packed overhead: what packed sequences (segment_ids, docs/contract.md
section 6) cost against the same op on unpacked rows.

Per op (gated_delta_rule, gdn_decoupled_conv1d) and impl (xla, pallas), two
variants of the fwd+bwd function (jax.grad of sum(outputs * fixed random
cotangents), jitted and compiled once, warmed up):

  unpacked  segment_ids=None
  packed    segment_ids of workloads.packed_layout: several documents of
            uneven lengths per row, boundaries off chunk edges, right padding
            on every row and one interior padding run

Both variants take the same arguments (the unpacked one ignores the ids) and
the same inputs. The four entries of an op are timed round by round, the
starting entry rotated each round, each timed run right after `settle`
untimed runs of the same entry (timing._timed_rounds, as the ladder). The
ratio packed/unpacked is the ratio of the medians (the checked figure); the
median of the per-round ratios (the two variants' runs of the same round) and
the ratio of the minima are reported beside it: on a shared machine they
move less with the load.

Checks recorded with the times: pallas against xla per variant (rel err),
and that the packed gradients are exactly 0 at padding tokens (the ids were
really applied).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gdn_kernels.backends import CHUNKED

from benchmarks import timing, workloads
from benchmarks.workloads import Size

IMPLS = CHUNKED      # the chunked impls (gdn_kernels.backends)
VARIANTS = ("unpacked", "packed")
MODE = "fwd+bwd"
DEFAULT_REPEATS = 9


def layout_summary(size: Size, chunk: int, seed: int) -> dict:
    """The packing as JSON: runs per row (id, length; id 0 = padding) and totals."""
    runs = workloads.packed_layout(size.B, size.T, chunk, seed)
    docs = [[n for i, n in row if i > 0] for row in runs]
    pads = [[n for i, n in row if i == 0] for row in runs]
    total_pad = sum(sum(p) for p in pads)
    return {
        "runs": [[list(r) for r in row] for row in runs],
        "documents_per_row": [len(d) for d in docs],
        "document_lengths": docs,
        "padding_runs": pads,
        "padding_fraction": total_pad / float(size.B * size.T),
        "text": "; ".join(
            f"row {b}: " + " ".join(f"{n}" if i > 0 else f"[pad {n}]" for i, n in row)
            for b, row in enumerate(runs)),
    }


def _padding_grads_zero(grads, pad: np.ndarray) -> bool:
    """Every gradient with a [B, T, ...] layout is exactly 0 at padding tokens."""
    bt = pad.shape
    ok = True
    for d in jax.tree_util.tree_leaves(grads):
        d = np.asarray(d)
        if d.ndim >= 2 and d.shape[:2] == bt:
            ok &= bool(np.all(d[pad] == 0))
    return ok


def _ratio_row(op: str, impl: str, unpacked: dict, packed: dict) -> dict:
    row = {"op": op, "impl": impl, "mode": MODE, "size_label": unpacked["size_label"]}
    if unpacked.get("status") != "ok" or packed.get("status") != "ok":
        row["packed/unpacked time"] = None
        row["note"] = (f"unpacked {unpacked.get('status')}, packed {packed.get('status')}")
        return row
    row["unpacked_median_s"] = unpacked["median_s"]
    row["packed_median_s"] = packed["median_s"]
    row["packed/unpacked time"] = packed["median_s"] / unpacked["median_s"]
    row["packed/unpacked min time"] = packed["min_s"] / unpacked["min_s"]
    a, b = unpacked["times_s"], packed["times_s"]
    if len(a) == len(b):
        per_round = [y / x for x, y in zip(a, b)]
        row["per_round_ratios"] = per_round
        row["packed/unpacked time (median per round)"] = statistics.median(per_round)
    for key in ("temp_bytes", "compile_total_s", "flops", "bytes_accessed"):
        if unpacked.get(key) and packed.get(key) is not None:
            row[f"packed/unpacked {key}"] = packed[key] / unpacked[key]
    return row


def run(cfg: timing.LadderConfig, size: Size,
        log: Callable[[str], None] = print) -> dict:
    """The packed-overhead section of the report: layout, records, ratios.
    cfg: ops, impls (those of IMPLS are run), repeats, warmup, settle, dtype,
    chunk, seed, budgets."""
    dtype = jnp.dtype(cfg.dtype)
    impls = [i for i in cfg.impls if i in IMPLS]
    ids_np = workloads.packed_segment_ids(size.B, size.T, cfg.chunk, cfg.seed)
    pad = ids_np == 0
    layout = layout_summary(size, cfg.chunk, cfg.seed)
    log(f"packed overhead at {size.label}: {layout['documents_per_row']} documents per row, "
        f"padding {100 * layout['padding_fraction']:.1f} % ({layout['text']})")
    records: List[dict] = []
    ratios: List[dict] = []
    for op in cfg.ops:
        args = workloads.device_inputs(op, size, dtype, cfg.seed) + [jnp.asarray(ids_np)]
        group, by_key = [], {}
        for impl in impls:
            for variant in VARIANTS:
                rec = timing._new_record(op, impl, MODE, size, cfg)
                rec["variant"], rec["packed"] = variant, variant == "packed"
                try:
                    compiled = timing._prepare_entry(cfg, rec, size, args, dtype, {})
                except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                    timing._error(rec, err)
                    compiled = None
                by_key[(impl, variant)] = rec
                records.append(rec)
                if compiled is None:
                    log(f"{variant:<9}" + timing._line(rec))
                else:
                    group.append((rec, compiled, {}))
        timing._timed_rounds(cfg, group, args)
        outs: Dict[tuple, object] = {}
        for rec, _, keep in group:
            out = keep.pop("out", None)
            if out is not None:
                outs[(rec["impl"], rec["variant"])] = out
                if rec["packed"]:
                    rec["padding_grads_zero"] = _padding_grads_zero(out, pad)
        for variant in VARIANTS:
            base, other = outs.get(("xla", variant)), outs.get(("pallas", variant))
            if base is not None and other is not None:
                by_key[("pallas", variant)]["rel_err_vs_xla"] = timing._rel_err(other, base)
        outs.clear()
        for rec, _, _ in group:
            timing._finish(rec, {}, size)
            log(f"{rec['variant']:<9}" + timing._line(rec))
        for impl in impls:
            row = _ratio_row(op, impl, by_key[(impl, "unpacked")], by_key[(impl, "packed")])
            ratios.append(row)
            r = row.get("packed/unpacked time")
            if r is not None:
                log(f"  {op} {impl}: packed/unpacked {r:.3f} (median per round "
                    f"{row.get('packed/unpacked time (median per round)', float('nan')):.3f})")
        timing.release_compiled()
        del args, group
    return {"size": size.as_dict(), "size_label": size.label, "mode": MODE,
            "impls": impls, "ops": list(cfg.ops), "repeats": cfg.repeats,
            "warmup": cfg.warmup, "settle": cfg.settle, "dtype": cfg.dtype,
            "chunk": cfg.chunk, "seed": cfg.seed, "layout": layout,
            "results": records, "ratios": ratios}


def config_for(base: timing.LadderConfig, repeats: Optional[int]) -> timing.LadderConfig:
    """The ladder's config with the packed run's repeats."""
    return dataclasses.replace(base, repeats=repeats or base.repeats)
