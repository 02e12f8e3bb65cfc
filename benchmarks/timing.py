"""Compile, budget and time the (op, impl, mode) entries over a ladder.

Per size and (op, mode), every impl is compiled first (lower + compile time,
compiled temp memory and XLA's cost analysis recorded), warmed up, then the
timed repeats are interleaved across impls (round robin, the starting impl
rotated each round), so the ratios between impls come from the same minutes
of a shared, drifting machine. Each timed run directly follows `settle`
untimed runs of the same entry: without them a run that follows another
impl pays for that impl's footprint (measured on CPU: the xla fwd+bwd at
B2-T4096-D128 took ~40% longer right after the reference's 6 GiB run than
after its own run), and a fixed rotation puts some impls after the
reference far more often than others.

An entry is skipped (recorded with the reason, its compile figures kept)
when its impl cannot run on this platform, when its compiled footprint
exceeds the memory budget, or when its predicted (from the previous rung,
linear in B*T*Hv*Dk*Dv) or warm-up time exceeds the time budget.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import jax

from verification.tolerance import errors

from benchmarks import workloads
from benchmarks.workloads import Size

GiB = 1 << 30

# (op, impl, mode, size, dtype, chunk, interpret mode) -> (compiled, info):
# every function is lowered and compiled once per shape.
_COMPILED: Dict[tuple, Tuple[object, dict]] = {}


@dataclasses.dataclass
class LadderConfig:
    sizes: Tuple[Size, ...] = workloads.DEFAULT_LADDER
    ops: Tuple[str, ...] = workloads.OPS
    impls: Tuple[str, ...] = workloads.IMPLS
    modes: Tuple[str, ...] = workloads.MODES
    repeats: int = 5
    warmup: int = 1
    settle: int = 1                # untimed runs of the same entry before each timed run
    dtype: str = "float32"
    chunk: int = 64
    seed: int = 0
    time_budget_s: float = 300.0   # per entry: warm-up + settle + repeats
    mem_budget_bytes: int = 8 * GiB  # per entry: compiled temp + arguments + outputs
    trace_dir: Optional[str] = None    # one extra run per entry under jax.profiler.trace
    trace_size: Optional[Size] = None  # ... at this size


def platform() -> str:
    return jax.devices()[0].platform


def unavailable_reason(impl: str) -> Optional[str]:
    """Why `impl` cannot run here, or None."""
    if impl == "pallas" and platform() == "gpu":
        return ("pallas_impl is written for TPU (pltpu VMEM scratch, DMA semaphores, "
                "pltpu.CompilerParams): it cannot compile for GPU, and interpret "
                "mode is not benchmarked on a device")
    return None


def interpret_mode(impl: str) -> str:
    if impl != "pallas":
        return "n/a"
    from gdn_kernels.interpret import resolved_mode
    return resolved_mode()


def _cost(compiled) -> dict:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend has it
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    cost = cost or {}
    out = {}
    for key, name in (("flops", "flops"), ("bytes accessed", "bytes_accessed"),
                      ("transcendentals", "transcendentals")):
        if key in cost:
            out[name] = float(cost[key])
    return out


def _memory(compiled) -> dict:
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return {}
    if m is None:
        return {}
    fields = {"temp_bytes": "temp_size_in_bytes", "argument_bytes": "argument_size_in_bytes",
              "output_bytes": "output_size_in_bytes", "alias_bytes": "alias_size_in_bytes",
              "code_bytes": "generated_code_size_in_bytes"}
    return {k: int(getattr(m, v)) for k, v in fields.items() if hasattr(m, v)}


def compile_entry(op, impl, mode, size: Size, dtype, chunk, args,
                  packed: Optional[bool] = None) -> Tuple[object, dict]:
    """The compiled executable of one entry (cached) and its compile figures.
    packed: None (the ladder), False / True (the packed-overhead variants,
    workloads.build_fn)."""
    key = (op, impl, mode, size, str(dtype), chunk, interpret_mode(impl), packed)
    if key in _COMPILED:
        return _COMPILED[key]
    fn = workloads.build_fn(op, impl, mode, size, chunk, packed)
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    info = {"lower_s": t1 - t0, "compile_s": t2 - t1, "compile_total_s": t2 - t0}
    info.update(_memory(compiled))
    info.update(_cost(compiled))
    _COMPILED[key] = (compiled, info)
    return compiled, info


def release_compiled() -> None:
    """Drop the cached executables (a finished size is never run again)."""
    _COMPILED.clear()


def time_once(compiled, args, keep: Optional[dict] = None) -> float:
    """Seconds of one run (to block_until_ready); the outputs go to
    keep["out"] when keep is given."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    dt = time.perf_counter() - t0
    if keep is not None:
        keep["out"] = out
    return dt


def _rel_err(out, ref) -> float:
    """max over output leaves of ||out - ref|| / ||ref||
    (verification.tolerance.errors), or ||out - ref|| where ref is all zero."""
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        rel, _, abs_l2, _ = errors(a, b)
        worst = max(worst, rel if math.isfinite(rel) else abs_l2)
    return worst


def _cross_check(group) -> None:
    """Every timed entry's outputs against the reference's (else xla's) from
    the same inputs: the impls compared compute the same thing."""
    outs = {rec["impl"]: keep.get("out") for rec, _, keep in group}
    base = "reference" if outs.get("reference") is not None else "xla"
    if outs.get(base) is None:
        return
    for rec, _, keep in group:
        if rec["impl"] != base and keep.get("out") is not None:
            rec[f"rel_err_vs_{base}"] = _rel_err(keep["out"], outs[base])
        keep.clear()


def _secs(x: float) -> str:
    return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.3g} ms"


def _size(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 4 else f"{n / 2**20:.1f} MiB"


def _footprint(rec: dict) -> int:
    return sum(int(rec.get(k, 0)) for k in ("temp_bytes", "argument_bytes", "output_bytes"))


def _new_record(op, impl, mode, size: Size, cfg: LadderConfig) -> dict:
    return {"op": op, "impl": impl, "mode": mode, "size": size.as_dict(),
            "size_label": size.label, "family": size.family_label, "T": size.T,
            "dtype": cfg.dtype, "chunk": cfg.chunk, "interpret": interpret_mode(impl),
            "status": "pending", "reason": "", "warmup_s": [], "times_s": []}


def _skip(rec: dict, reason: str) -> None:
    rec["status"], rec["reason"] = "skipped", reason


def _error(rec: dict, err: BaseException) -> None:
    msg = f"{type(err).__name__}: {err}"
    rec["status"], rec["reason"] = "error", msg.splitlines()[0][:400]


def run_ladder(cfg: LadderConfig, log: Callable[[str], None] = print) -> List[dict]:
    """All entries of the ladder as JSON-ready records (see module doc)."""
    import jax.numpy as jnp
    dtype = jnp.dtype(cfg.dtype)
    records: List[dict] = []
    last_ok: Dict[tuple, Tuple[int, float]] = {}   # (op, impl, mode) -> (work, median)
    for size in cfg.sizes:
        for op in cfg.ops:
            args = workloads.device_inputs(op, size, dtype, cfg.seed)
            for mode in cfg.modes:
                group, skipped = _prepare_group(cfg, op, mode, size, args, dtype,
                                                last_ok, log)
                _timed_rounds(cfg, group, args)
                _cross_check(group)
                for rec, _, _ in group:
                    _finish(rec, last_ok, size)
                    log(_line(rec))
                if cfg.trace_dir and size == cfg.trace_size:
                    _trace(cfg, group, args, log)
                records.extend(rec for rec, _, _ in group)
                records.extend(skipped)
                release_compiled()
            del args
    records.sort(key=lambda r: (cfg.sizes.index(Size(**r["size"])), cfg.ops.index(r["op"]),
                                cfg.modes.index(r["mode"]), cfg.impls.index(r["impl"])))
    return records


def _prepare_group(cfg, op, mode, size, args, dtype, last_ok, log):
    """Compile and warm up every impl of one (size, op, mode). Returns
    ([(record, compiled)] of the entries to time, [skipped / failed records])."""
    group, skipped = [], []
    for impl in cfg.impls:
        rec = _new_record(op, impl, mode, size, cfg)
        rec["loadavg_1m"] = os.getloadavg()[0]
        try:
            compiled = _prepare_entry(cfg, rec, size, args, dtype, last_ok)
        except Exception as err:  # noqa: BLE001 - recorded, the ladder goes on
            _error(rec, err)
            compiled = None
        if compiled is None:
            skipped.append(rec)
            log(_line(rec))
        else:
            group.append((rec, compiled, {}))
    return group, skipped


def _prepare_entry(cfg, rec, size, args, dtype, last_ok):
    """Compile and warm up the entry of `rec`. Returns the executable, or
    None with `rec` marked skipped; compile and run errors propagate."""
    op, impl, mode = rec["op"], rec["impl"], rec["mode"]
    reason = unavailable_reason(impl)
    if reason:
        _skip(rec, reason)
        return None
    compiled, info = compile_entry(op, impl, mode, size, dtype, cfg.chunk, args,
                                   rec.get("packed"))
    rec.update(info)
    foot = _footprint(rec)
    if foot > cfg.mem_budget_bytes:
        _skip(rec, f"compiled footprint {_size(foot)} (temp "
                   f"{_size(rec.get('temp_bytes', 0))}) > memory budget "
                   f"{_size(cfg.mem_budget_bytes)}")
        return None
    runs = cfg.warmup + cfg.repeats * (1 + cfg.settle)
    prev = last_ok.get((op, impl, mode))
    if prev is not None:
        predicted = prev[1] * size.work / prev[0]
        rec["predicted_s"] = predicted
        if predicted * runs > cfg.time_budget_s:
            _skip(rec, f"predicted {_secs(predicted)} per run (linear from the previous "
                       f"rung) x {runs} runs > time budget {_secs(cfg.time_budget_s)}")
            return None
    for _ in range(cfg.warmup):
        rec["warmup_s"].append(time_once(compiled, args))
    one = min(rec["warmup_s"]) if rec["warmup_s"] else 0.0
    if one * runs > cfg.time_budget_s:
        # A first run pays one-time costs (page faults of a fresh multi-GiB
        # temp buffer: the reference fwd+bwd at B2-T4096-D128 took 14 s
        # once, then 5 s): measure once more before giving up.
        rec["warmup_s"].append(time_once(compiled, args))
        one = min(rec["warmup_s"])
    if one * runs > cfg.time_budget_s:
        _skip(rec, f"one run took {_secs(one)}; x {runs} runs > time budget "
                   f"{_secs(cfg.time_budget_s)}")
        return None
    return compiled


def _timed_rounds(cfg: LadderConfig, group, args) -> None:
    if not group:
        return
    for r in range(cfg.repeats):
        for i in range(len(group)):
            rec, compiled, keep = group[(i + r) % len(group)]
            if rec["status"] == "error":
                continue
            try:
                for _ in range(cfg.settle):
                    time_once(compiled, args)
                rec["times_s"].append(time_once(compiled, args,
                                                keep if r == cfg.repeats - 1 else None))
            except Exception as err:  # noqa: BLE001
                _error(rec, err)


def _finish(rec: dict, last_ok: dict, size: Size) -> None:
    if rec["status"] == "error":
        return
    ts = rec["times_s"]
    if not ts:
        _skip(rec, rec["reason"] or "no timed runs")
        return
    rec["status"] = "ok"
    rec["repeats"] = len(ts)
    rec["median_s"] = statistics.median(ts)
    rec["min_s"], rec["max_s"] = min(ts), max(ts)
    last_ok[(rec["op"], rec["impl"], rec["mode"])] = (size.work, rec["median_s"])


def _trace(cfg: LadderConfig, group, args, log) -> None:
    """One extra run of every timed entry under jax.profiler.trace."""
    for rec, compiled, _ in group:
        path = os.path.join(cfg.trace_dir, rec["size_label"],
                            f"{rec['op']}-{rec['mode'].replace('+', '')}-{rec['impl']}")
        os.makedirs(path, exist_ok=True)
        try:
            with jax.profiler.trace(path):
                time_once(compiled, args)
            rec["trace_dir"] = path
        except Exception as err:  # noqa: BLE001 - tracing is best effort
            log(f"  trace failed for {rec['impl']}: {err}")


def _line(rec: dict) -> str:
    head = f"{rec['size_label']:<26} {rec['op']:<10} {rec['mode']:<7} {rec['impl']:<12}"
    mem = f"temp {rec['temp_bytes'] / 2**20:9.1f} MiB" if "temp_bytes" in rec else " " * 18
    comp = f"compile {rec['compile_total_s']:6.2f} s" if "compile_total_s" in rec else " " * 16
    if rec["status"] == "ok":
        return (f"{head} {rec['median_s'] * 1e3:10.2f} ms [{rec['min_s'] * 1e3:.2f}, "
                f"{rec['max_s'] * 1e3:.2f}]  {comp}  {mem}")
    return f"{head} {rec['status'].upper():>10}  {comp}  {mem}  {rec['reason']}"


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
