"""Decode and chunked prefill: the carried state of the mixer
(docs/contract.md section 7) as a serving loop uses it.

Decode (per B of workloads.DECODE_SIZES: Hk=16, Hv=32, Dk=Dv=128, K=4):
token-by-token loops driven from Python, each step feeding the returned state
back in, every step blocking on its output (a serving loop reads the token
before it builds the next input; --decode-sync end blocks once per loop):

  xla, pallas  ours: o, st = gdn_decoupled_conv1d(x_t, ..., state=st,
               return_state=True, impl=...), the public API with its
               validation, x_t [B, 1, C], a_t, b_t [B, 1, Hv]
  plain        the baseline: one recurrent step written here in plain JAX from
               the contract's formulas (conv window = concat(state.conv, x_t),
               sum(w * window), silu, split q/k/v, L2 norm with eps, gates,
               S = exp(g) S; S += k (beta (v - S^T k))^T; o = scale S^T q),
               under one jax.jit, returning (o, new conv window, S)

All entries take the very same per-token arrays (sliced before the timing)
and the same incoming state. A timed run is a loop of `steps` tokens from that
state; the per-token time is its time / steps. The entries of one B run round
by round, the starting entry rotated each round, each timed run right after
`settle` untimed runs of the same entry (as timing._timed_rounds). Checked:
xla/plain of the per-token medians <= TARGET at every B. Reported beside it:
the median of the per-round ratios and the ratio of the minima.

Before the timing, each of ours runs `count_steps` steps once (untimed; the
plain step `steps` steps) while
jax.monitoring counts XLA backend compiles and jaxpr traces (the events
verification/engine/runners.py counts): one compiled program must serve the whole
loop (contract section 7), so every compile must fall on the first step.
After the timing, one more untimed loop per entry gives the outputs: ours
against plain (relative L2 distance over the `steps` outputs and the final
state) and the xla loop against one xla call on the same `steps` tokens with
the same incoming state (split invariance).

Chunked prefill (workloads.PREFILL_SIZE, forward only, impl="xla"): one call
on the whole rows against calls on pieces of workloads.PREFILL_PIECES tokens
chaining the state (the first piece with state=None), each call through the
public API (jitted inside it; compiled and warmed before the timing),
interleaved the same way. Reported: pieces / one pass of the medians, per
round and of the minima, and the relative L2 distance (and max |diff| over
max |one pass|) of the outputs and of both parts of the final state.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import statistics
import threading
import time
from typing import Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from gdn_kernels.backends import CHUNKED
import gdn_kernels
from gdn_kernels.l2norm import DEFAULT_EPS

from benchmarks import timing, workloads
from benchmarks.workloads import Size

TARGET = 1.2                 # xla / plain per-token decode time, every B
DECODE_IMPLS = CHUNKED      # the chunked impls (gdn_kernels.backends)
BASELINE = "plain"
DEFAULT_STEPS = 32           # tokens per timed run
DEFAULT_COUNT_STEPS = 256    # tokens of the untimed compile-count loop
DEFAULT_REPEATS = 7
PREFILL_IMPL = "xla"
SYNCS = ("step", "end")

# ---------------------------------------------------------------- compiles
_EVENTS = {"/jax/core/compile/backend_compile_duration": "compiles",
           "/jax/core/compile/jaxpr_trace_duration": "traces"}
_counts = {"compiles": 0, "traces": 0}
_lock = threading.Lock()


def _on_event(event: str, duration: float, **_):
    key = _EVENTS.get(event)
    if key:
        with _lock:
            _counts[key] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def counts() -> Tuple[int, int]:
    """(XLA backend compiles, jaxpr traces) so far in this process."""
    return _counts["compiles"], _counts["traces"]


# ---------------------------------------------------------------- the API
def state_api_reason() -> Optional[str]:
    """Why gdn_decoupled_conv1d cannot carry state here, or None."""
    params = inspect.signature(gdn_kernels.gdn_decoupled_conv1d).parameters
    missing = [k for k in ("state", "return_state") if k not in params]
    if missing:
        return ("gdn_kernels.gdn_decoupled_conv1d has no " + ", ".join(f"{k}=" for k in missing)
                + " keyword yet (docs/contract.md section 7 planned)")
    return None


def _heads(size: Size) -> dict:
    return dict(num_k_heads=size.Hk, num_v_heads=size.Hv, head_k_dim=size.Dk,
                head_v_dim=size.Dv)


# ---------------------------------------------------------------- inputs
@dataclasses.dataclass
class DecodeInputs:
    tokens: List[Tuple[jax.Array, jax.Array, jax.Array]]   # per step (x [B,1,C], a, b [B,1,Hv]);
                                                           # a longer loop cycles through them
    params: Tuple[jax.Array, ...]                          # conv_weight, a_log, dt_bias
    conv0: jax.Array                                       # [B, K-1, C], x's dtype
    rec0: jax.Array                                        # [B, Hv, Dk, Dv] float32
    x_all: jax.Array                                       # [B, steps, C] (one-pass check)
    a_all: jax.Array
    b_all: jax.Array


def decode_inputs(size: Size, steps: int, dtype, seed: int) -> DecodeInputs:
    """workloads.make_inputs("mixer") over `steps` tokens, sliced per token,
    and a nonzero incoming state (a conv history like x, a recurrent state of
    entries ~N(0, 0.1^2))."""
    seq = dataclasses.replace(size, T=max(steps, 1))
    (x, w, a, b, a_log, dt_bias), _ = workloads.make_inputs("mixer", seq, seed)
    rng = np.random.default_rng(seed + 104729)
    conv0 = rng.standard_normal((size.B, workloads.CONV_WIDTH - 1, size.channels), np.float32)
    rec0 = 0.1 * rng.standard_normal((size.B, size.Hv, size.Dk, size.Dv), np.float32)
    xj, aj, bj = (jnp.asarray(v, dtype) for v in (x, a, b))
    tokens = [(xj[:, t:t + 1], aj[:, t:t + 1], bj[:, t:t + 1]) for t in range(steps)]
    params = tuple(jnp.asarray(v, jnp.float32) for v in (w, a_log, dt_bias))
    out = DecodeInputs(tokens, params, jnp.asarray(conv0, dtype), jnp.asarray(rec0), xj, aj, bj)
    jax.block_until_ready((out.tokens, out.params, out.conv0, out.rec0))
    return out


# ---------------------------------------------------------------- the baseline
def plain_step_fn(size: Size, eps: float = float(DEFAULT_EPS),
                  scale: Optional[float] = None) -> Callable:
    """jax.jit of one recurrent decode step, from the formulas of
    docs/contract.md sections 1, 2 and 7. f(x [B,1,C], w [K,C], a, b [B,1,Hv],
    a_log, dt_bias [Hv], conv [B,K-1,C], S [B,Hv,Dk,Dv] f32)
    -> (o [B,1,Hv,Dv] in x's dtype, new conv [B,K-1,C], new S)."""
    hk, hv, dk, dv = size.Hk, size.Hv, size.Dk, size.Dv
    grp = hv // hk
    scale = float(dk ** -0.5 if scale is None else scale)
    f32 = jnp.float32

    def l2(u):
        return u * jax.lax.rsqrt(jnp.sum(u * u, axis=-1, keepdims=True) + eps)

    def step(x, w, a, b, a_log, dt_bias, conv, S):
        bsz = x.shape[0]
        window = jnp.concatenate([conv, x], axis=1)                        # [B, K, C]
        y = jax.nn.silu(jnp.sum(w.astype(f32)[None] * window.astype(f32), axis=1))
        q = l2(y[:, :hk * dk].reshape(bsz, hk, dk))
        k = l2(y[:, hk * dk:2 * hk * dk].reshape(bsz, hk, dk))
        v = y[:, 2 * hk * dk:].reshape(bsz, hv, dv)
        q, k = jnp.repeat(q, grp, axis=1), jnp.repeat(k, grp, axis=1)      # [B, Hv, Dk]
        g = -jnp.exp(a_log.astype(f32)) * jax.nn.softplus(a[:, 0].astype(f32)
                                                          + dt_bias.astype(f32))
        beta = jax.nn.sigmoid(b[:, 0].astype(f32))                         # [B, Hv]
        S = jnp.exp(g)[:, :, None, None] * S
        u = beta[:, :, None] * (v - jnp.einsum("bhk,bhkv->bhv", k, S))
        S = S + k[:, :, :, None] * u[:, :, None, :]
        o = scale * jnp.einsum("bhk,bhkv->bhv", q, S)
        return o[:, None].astype(x.dtype), window[:, 1:], S

    return jax.jit(step)


# ---------------------------------------------------------------- the loops
class Entry:
    """One decode entry: run(inp, n, sync, keep, on_step) -> (final conv,
    final recurrent, outputs or None)."""

    def __init__(self, name: str, size: Size, chunk: int):
        self.name, self.size, self.chunk = name, size, chunk
        if name == BASELINE:
            self._plain = plain_step_fn(size)
        else:
            self._heads = _heads(size)

    def compiled_step(self, inp: DecodeInputs):
        """One step as one compiled program (ours: the public call under an
        outer jax.jit, which inlines the op's own jit) for XLA's cost and
        memory analysis."""
        w, a_log, dt_bias = inp.params
        x, a, b = inp.tokens[0]
        if self.name == BASELINE:
            fn = self._plain
        else:
            op, impl, heads, cls = (gdn_kernels.gdn_decoupled_conv1d, self.name, self._heads,
                                    gdn_kernels.GDNState)

            def step(x, w, a, b, a_log, dt_bias, conv, rec):
                o, st = op(x, w, a, b, a_log, dt_bias, **heads, chunk_size=self.chunk,
                           impl=impl, state=cls(conv, rec), return_state=True)
                return o, st.conv, st.recurrent
            fn = jax.jit(step)
        return fn.lower(x, w, a, b, a_log, dt_bias, inp.conv0, inp.rec0).compile()

    def run(self, inp: DecodeInputs, n: int, sync: str = "step", keep: bool = False,
            on_step: Optional[Callable[[int], None]] = None):
        w, a_log, dt_bias = inp.params
        outs = [] if keep else None
        o = None
        if self.name == BASELINE:
            plain, state = self._plain, (inp.conv0, inp.rec0)

            def step(x, a, b, state):
                o, conv, rec = plain(x, w, a, b, a_log, dt_bias, *state)
                return o, (conv, rec)
        else:
            op, impl, heads = gdn_kernels.gdn_decoupled_conv1d, self.name, self._heads
            state = gdn_kernels.GDNState(inp.conv0, inp.rec0)

            def step(x, a, b, state):
                return op(x, w, a, b, a_log, dt_bias, **heads, chunk_size=self.chunk,
                          impl=impl, state=state, return_state=True)
        for t in range(n):
            x, a, b = inp.tokens[t % len(inp.tokens)]
            o, state = step(x, a, b, state)
            if sync == "step":
                o.block_until_ready()
            if keep:
                outs.append(o)
            if on_step is not None:
                on_step(t)
        conv, rec = state
        jax.block_until_ready((o, conv, rec))
        return conv, rec, outs


def _count_loop(entry: Entry, inp: DecodeInputs, n: int, sync: str) -> dict:
    """Compiles and traces during one untimed n-step loop, and on which steps."""
    per_step: List[Tuple[int, int]] = []
    last = list(counts())

    def on_step(_t):
        c, tr = counts()
        per_step.append((c - last[0], tr - last[1]))
        last[0], last[1] = c, tr

    c0, t0 = counts()
    w0 = time.perf_counter()
    entry.run(inp, n, sync, on_step=on_step)
    wall = time.perf_counter() - w0
    c1, t1 = counts()
    comp_steps = [i for i, (c, _) in enumerate(per_step) if c]
    return {"steps": n, "compiles": c1 - c0, "traces": t1 - t0,
            "compiles_first_step": per_step[0][0] if per_step else 0,
            "traces_first_step": per_step[0][1] if per_step else 0,
            "compiles_after_first_step": sum(c for c, _ in per_step[1:]),
            "traces_after_first_step": sum(tr for _, tr in per_step[1:]),
            "steps_that_compiled": comp_steps[:20], "wall_s": wall}


def _rel(a, b) -> dict:
    """Relative L2 distance (verification.tolerance.errors) and
    max |a - b| / max |b|."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    rel = timing._rel_err(a, b)
    peak = float(np.max(np.abs(b64))) if b64.size else 0.0
    mx = float(np.max(np.abs(a64 - b64))) if a64.size else 0.0
    return {"rel_l2": rel, "max_abs": mx, "max_abs_over_max_ref": mx / peak if peak else mx}


def _compare(out, ref) -> dict:
    """out, ref: (o, conv, recurrent) -> per tensor _rel, and the worst rel_l2."""
    res = {name: _rel(x, y) for name, x, y in zip(("o", "conv", "recurrent"), out, ref)}
    res["worst_rel_l2"] = max(v["rel_l2"] for v in res.values())
    return res


def _new_rec(kind: str, name: str, size: Size, dtype: str, **extra) -> dict:
    rec = {"kind": kind, "entry": name, "size": size.as_dict(), "size_label": size.label,
           "B": size.B, "dtype": dtype, "interpret": timing.interpret_mode(name)
           if name in DECODE_IMPLS else "n/a", "status": "pending", "reason": "",
           "warmup_s": [], "times_s": [], "loadavg_1m": os.getloadavg()[0]}
    rec.update(extra)
    return rec


def _finish(rec: dict, per: int) -> None:
    """Medians; `per` tokens (decode) or 1 (prefill: whole runs)."""
    if rec["status"] == "error":
        return
    ts = rec["times_s"]
    if not ts:
        rec["status"] = "skipped"
        rec["reason"] = rec["reason"] or "no timed runs"
        return
    rec["status"] = "ok"
    rec["repeats"] = len(ts)
    rec["median_s"], rec["min_s"], rec["max_s"] = statistics.median(ts), min(ts), max(ts)
    if per > 1:
        rec["per_token_median_s"] = rec["median_s"] / per
        rec["per_token_min_s"] = rec["min_s"] / per
        rec["per_token_max_s"] = rec["max_s"] / per


def _ratio(num: dict, den: dict, label: str) -> dict:
    row = {"label": label}
    if num.get("status") != "ok" or den.get("status") != "ok":
        row["time"] = None
        row["note"] = (f"{num.get('entry')} {num.get('status')}, "
                       f"{den.get('entry')} {den.get('status')}")
        return row
    row["time"] = num["median_s"] / den["median_s"]
    row["min time"] = num["min_s"] / den["min_s"]
    a, b = num["times_s"], den["times_s"]
    if len(a) == len(b):
        row["per_round"] = [x / y for x, y in zip(a, b)]
        row["time (median per round)"] = statistics.median(row["per_round"])
    return row


def _rounds(group, repeats: int, settle: int, run_once: Callable) -> None:
    """timing._timed_rounds for loops: round robin, start rotated, settle runs."""
    for r in range(repeats):
        for i in range(len(group)):
            rec, obj = group[(i + r) % len(group)]
            if rec["status"] == "error":
                continue
            try:
                for _ in range(settle):
                    run_once(obj)
                t0 = time.perf_counter()
                run_once(obj)
                rec["times_s"].append(time.perf_counter() - t0)
            except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                timing._error(rec, err)


# ---------------------------------------------------------------- decode
@dataclasses.dataclass
class DecodeConfig:
    sizes: Tuple[Size, ...] = workloads.DECODE_SIZES
    impls: Tuple[str, ...] = DECODE_IMPLS
    steps: int = DEFAULT_STEPS
    count_steps: int = DEFAULT_COUNT_STEPS
    repeats: int = DEFAULT_REPEATS
    warmup: int = 1
    settle: int = 1
    sync: str = "step"
    dtype: str = "float32"
    chunk: int = 64
    seed: int = 0
    time_budget_s: float = 300.0
    prefill: bool = True
    decode: bool = True
    prefill_size: Size = workloads.PREFILL_SIZE
    prefill_pieces: Tuple[int, ...] = workloads.PREFILL_PIECES


def _decode_size(cfg: DecodeConfig, size: Size, log) -> Tuple[List[dict], List[dict]]:
    dtype = jnp.dtype(cfg.dtype)
    inp = decode_inputs(size, cfg.steps, dtype, cfg.seed)
    reason = state_api_reason()
    names = [n for n in cfg.impls if n in DECODE_IMPLS] + [BASELINE]
    group, records = [], {}
    runs = cfg.warmup + cfg.repeats * (1 + cfg.settle)
    for name in names:
        rec = _new_rec("decode", name, size, cfg.dtype, steps=cfg.steps, sync=cfg.sync)
        records[name] = rec
        why = reason if name != BASELINE else None
        why = why or (timing.unavailable_reason(name) if name != BASELINE else None)
        if why:
            rec["status"], rec["reason"] = "skipped", why
            log(_line(rec))
            continue
        try:
            entry = Entry(name, size, cfg.chunk)
            # the plain step's count only shows it compiles once: `steps` tokens
            n_count = cfg.count_steps if name != BASELINE else min(cfg.steps, cfg.count_steps)
            rec["compile_count"] = _count_loop(entry, inp, n_count, cfg.sync)
            try:
                compiled = entry.compiled_step(inp)
                rec["step_cost"] = {**timing._cost(compiled), **timing._memory(compiled)}
                del compiled
            except Exception as err:  # noqa: BLE001 - a figure, not the timing
                rec["step_cost_error"] = f"{type(err).__name__}: {err}"[:400]
            for _ in range(cfg.warmup):
                t0 = time.perf_counter()
                entry.run(inp, cfg.steps, cfg.sync)
                rec["warmup_s"].append(time.perf_counter() - t0)
            one = min(rec["warmup_s"]) if rec["warmup_s"] else (
                rec["compile_count"]["wall_s"] * cfg.steps / max(cfg.count_steps, 1))
            if one * runs > cfg.time_budget_s:
                rec["status"] = "skipped"
                rec["reason"] = (f"one {cfg.steps}-step loop took {one:.2f} s; x {runs} runs "
                                 f"> time budget {cfg.time_budget_s:.0f} s")
                log(_line(rec))
                continue
            group.append((rec, entry))
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            timing._error(rec, err)
            log(_line(rec))
    _rounds(group, cfg.repeats, cfg.settle, lambda e: e.run(inp, cfg.steps, cfg.sync))
    # outputs after `steps` tokens: ours against plain, and the xla loop
    # against one xla call on the same tokens (split invariance)
    finals = {}
    for rec, entry in group:
        if rec["status"] == "error":
            continue
        try:
            conv, rec_s, outs = entry.run(inp, cfg.steps, cfg.sync, keep=True)
            finals[rec["entry"]] = (jnp.concatenate(outs, axis=1), conv, rec_s)
        except Exception as err:  # noqa: BLE001
            timing._error(rec, err)
    base = finals.get(BASELINE)
    for name, fin in finals.items():
        if name != BASELINE and base is not None:
            records[name]["vs_plain"] = _compare(fin, base)
    if "xla" in finals and cfg.steps > 1:
        try:
            w, a_log, dt_bias = inp.params
            sl = slice(0, cfg.steps)
            o, st = gdn_kernels.gdn_decoupled_conv1d(
                inp.x_all[:, sl], w, inp.a_all[:, sl], inp.b_all[:, sl], a_log, dt_bias,
                **_heads(size), chunk_size=cfg.chunk, impl="xla",
                state=gdn_kernels.GDNState(inp.conv0, inp.rec0), return_state=True)
            records["xla"]["vs_one_pass"] = _compare(finals["xla"], (o, st.conv, st.recurrent))
        except Exception as err:  # noqa: BLE001 - a check, not the timing
            records["xla"]["vs_one_pass_error"] = f"{type(err).__name__}: {err}"[:400]
    finals.clear()
    for rec in records.values():
        _finish(rec, cfg.steps)
        log(_line(rec))
    ratios = []
    for name in names:
        if name == BASELINE:
            continue
        row = _ratio(records[name], records[BASELINE], f"{name} / {BASELINE}")
        row.update({"B": size.B, "size_label": size.label, "impl": name})
        if name == "xla":
            row["target"] = TARGET
            row["pass"] = None if row["time"] is None else row["time"] <= TARGET
        ratios.append(row)
        if row["time"] is not None:
            log(f"  B={size.B} {name}/{BASELINE} per token {row['time']:.3f} "
                f"(median per round {row.get('time (median per round)', math.nan):.3f}, "
                f"min {row['min time']:.3f})")
    del inp
    return list(records.values()), ratios


def _line(rec: dict) -> str:
    head = f"{rec['kind']:<8} {rec['size_label']:<24} {rec['entry']:<14}"
    cc = rec.get("compile_count")
    comp = (f"compiles {cc['compiles']} (after step 1: {cc['compiles_after_first_step']})"
            if cc else "")
    if rec["status"] == "ok":
        if "per_token_median_s" in rec:
            return (f"{head} {rec['per_token_median_s'] * 1e3:9.3f} ms/token "
                    f"[{rec['per_token_min_s'] * 1e3:.3f}, {rec['per_token_max_s'] * 1e3:.3f}]"
                    f"  {comp}")
        return (f"{head} {rec['median_s'] * 1e3:9.1f} ms "
                f"[{rec['min_s'] * 1e3:.1f}, {rec['max_s'] * 1e3:.1f}]")
    if rec["status"] == "pending":
        return f"{head} {comp}"
    return f"{head} {rec['status'].upper():>10}  {comp}  {rec['reason']}"


# ---------------------------------------------------------------- prefill
class Prefill:
    """The rows of `size` in calls of `piece` tokens (piece == T: one pass)."""

    def __init__(self, size: Size, piece: int, chunk: int, args):
        self.size, self.piece, self.chunk = size, piece, chunk
        x, w, a, b, a_log, dt_bias = args
        self.params = (w, a_log, dt_bias)
        n = size.T // piece
        self.pieces = [(x[:, i * piece:(i + 1) * piece], a[:, i * piece:(i + 1) * piece],
                        b[:, i * piece:(i + 1) * piece]) for i in range(n)]
        jax.block_until_ready(self.pieces)

    def run(self, keep: bool = False):
        w, a_log, dt_bias = self.params
        st, outs, o = None, [], None
        for x, a, b in self.pieces:
            o, st = gdn_kernels.gdn_decoupled_conv1d(
                x, w, a, b, a_log, dt_bias, **_heads(self.size), chunk_size=self.chunk,
                impl=PREFILL_IMPL, state=st, return_state=True)
            if keep:
                outs.append(o)
        jax.block_until_ready((o, st))
        return (jnp.concatenate(outs, axis=1) if keep else None), st


def run_prefill(cfg: DecodeConfig, log) -> Tuple[List[dict], List[dict]]:
    size = cfg.prefill_size
    dtype = jnp.dtype(cfg.dtype)
    args = workloads.device_inputs("mixer", size, dtype, cfg.seed)[:6]
    reason = state_api_reason()
    pieces = [p for p in cfg.prefill_pieces if size.T % p == 0]
    bad = [p for p in cfg.prefill_pieces if size.T % p]
    if bad:
        log(f"prefill: piece lengths {bad} do not divide T={size.T}; dropped")
    if size.T not in pieces:
        pieces = [size.T] + pieces
    group, records = [], {}
    for p in pieces:
        name = "one pass" if p == size.T else f"{size.T // p} x {p}"
        rec = _new_rec("prefill", name, size, cfg.dtype, piece=p, calls=size.T // p,
                       impl=PREFILL_IMPL)
        records[p] = rec
        if reason:
            rec["status"], rec["reason"] = "skipped", reason
            log(_line(rec))
            continue
        try:
            pf = Prefill(size, p, cfg.chunk, args)
            c0, t0c = counts()
            t0 = time.perf_counter()
            pf.run()
            rec["first_run_s"] = time.perf_counter() - t0
            c1, t1c = counts()
            rec["first_run_compiles"], rec["first_run_traces"] = c1 - c0, t1c - t0c
            for _ in range(cfg.warmup):
                t0 = time.perf_counter()
                pf.run()
                rec["warmup_s"].append(time.perf_counter() - t0)
            c2, _ = counts()
            rec["warm_run_compiles"] = c2 - c1
            group.append((rec, pf))
        except Exception as err:  # noqa: BLE001
            timing._error(rec, err)
            log(_line(rec))
    _rounds(group, cfg.repeats, cfg.settle, lambda pf: pf.run())
    finals = {}
    for rec, pf in group:
        if rec["status"] == "error":
            continue
        try:
            o, st = pf.run(keep=True)
            finals[rec["piece"]] = (o, st.conv, st.recurrent)
        except Exception as err:  # noqa: BLE001
            timing._error(rec, err)
    base = finals.get(size.T)
    for p, fin in finals.items():
        if p != size.T and base is not None:
            records[p]["vs_one_pass"] = _compare(fin, base)
    finals.clear()
    ratios = []
    for p, rec in records.items():
        _finish(rec, 1)
        log(_line(rec))
    for p, rec in records.items():
        if p == size.T:
            continue
        row = _ratio(rec, records[size.T], f"{rec['entry']} / one pass")
        row.update({"piece": p, "calls": size.T // p})
        ratios.append(row)
        if row["time"] is not None:
            log(f"  prefill {rec['entry']} / one pass {row['time']:.3f} "
                f"(median per round {row.get('time (median per round)', math.nan):.3f})")
    return list(records.values()), ratios


# ---------------------------------------------------------------- the section
def run(cfg: DecodeConfig, log: Callable[[str], None] = print) -> dict:
    """The decode section of the report (JSON-ready)."""
    reason = state_api_reason()
    if reason:
        log(f"decode: {reason}; ours is skipped")
    decode_records, decode_ratios = [], []
    if cfg.decode:
        for size in cfg.sizes:
            recs, rats = _decode_size(cfg, size, log)
            decode_records += recs
            decode_ratios += rats
    prefill_records, prefill_ratios = [], []
    if cfg.prefill:
        prefill_records, prefill_ratios = run_prefill(cfg, log)
    acceptance = [{"check": f"decode xla/plain per-token time, B={r['B']}",
                   "value": r["time"], "target": TARGET, "pass": r["pass"]}
                  for r in decode_ratios if r["impl"] == "xla"]
    for r in decode_records:
        cc = r.get("compile_count")
        if r["entry"] in DECODE_IMPLS and cc:
            acceptance.append({"check": f"decode {r['entry']} compiles after the first of "
                                        f"{cc['steps']} steps, B={r['B']}",
                               "value": cc["compiles_after_first_step"], "target": 0,
                               "pass": cc["compiles_after_first_step"] == 0})
    return {
        "config": {"sizes": [s.as_dict() for s in cfg.sizes], "impls": list(cfg.impls),
                   "baseline": BASELINE, "steps": cfg.steps, "count_steps": cfg.count_steps,
                   "repeats": cfg.repeats, "warmup": cfg.warmup, "settle": cfg.settle,
                   "sync": cfg.sync, "dtype": cfg.dtype, "state_dtype": "float32",
                   "chunk": cfg.chunk, "seed": cfg.seed, "time_budget_s": cfg.time_budget_s,
                   "target": TARGET, "prefill_size": cfg.prefill_size.as_dict(),
                   "prefill_size_label": cfg.prefill_size.label,
                   "prefill_pieces": list(cfg.prefill_pieces), "prefill_impl": PREFILL_IMPL,
                   "api_reason": reason},
        "decode": decode_records, "decode_ratios": decode_ratios,
        "prefill": prefill_records, "prefill_ratios": prefill_ratios,
        "acceptance": acceptance,
    }


# ---------------------------------------------------------------- markdown
def _tok(x):
    return "" if x is None else f"{x * 1e3:.3f}" if x < 0.01 else f"{x * 1e3:.1f}"


def _ms(x):
    return "" if x is None else f"{x * 1e3:.1f}"


def _r(x, digits=3):
    return "" if x is None else f"{x:.{digits}f}"


def _e(x):
    return "" if x is None else f"{x:.1e}"


def markdown_section(doc: dict) -> str:
    cfg = doc["config"]
    lines = []
    if cfg.get("api_reason"):
        lines += [f"**Note:** {cfg['api_reason']}: ours was not run.", ""]
    if doc["decode"]:
        sync = ("each step blocks on its output" if cfg["sync"] == "step"
                else "the loop blocks once at its end")
        lines += [f"## Decode (T=1 per call, {cfg['dtype']} activations, float32 state)", "",
                  f"Per-token time of a {cfg['steps']}-token loop driven from Python, "
                  f"feeding the returned state back ({sync}); median of {cfg['repeats']} "
                  f"timed loops after {cfg['warmup']} warm-up loop(s); entries interleaved "
                  f"round by round, each timed loop right after {cfg['settle']} untimed "
                  f"loop(s) of the same entry. xla / pallas: the public "
                  f"`gdn_decoupled_conv1d(..., state=st, return_state=True)`; plain: one "
                  f"jitted recurrent step written from the contract's formulas. Compiles: "
                  f"XLA backend compiles (jaxpr traces) during one untimed "
                  f"{cfg['count_steps']}-step loop (plain: {cfg['steps']} steps) run before "
                  f"the timing, the first call at that B included. Step MB accessed, temp: "
                  f"XLA's cost and memory analysis of one step compiled as one program "
                  f"(ours under an outer jax.jit). rel err: relative "
                  f"L2 distance after {cfg['steps']} steps, worst over the outputs and both "
                  f"parts of the final state.", "",
                  "| size | entry | per token ms | min ms | max ms | compiles "
                  "| after step 1 | step MB accessed | step temp MiB | rel err vs plain "
                  "| rel err vs one pass | note |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in doc["decode"]:
            cc = r.get("compile_count") or {}
            note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
            if r.get("vs_one_pass_error"):
                note += f" one-pass check: {r['vs_one_pass_error']}"
            comp = f"{cc['compiles']} ({cc['traces']})" if cc else ""
            after = (f"{cc['compiles_after_first_step']} ({cc['traces_after_first_step']})"
                     if cc else "")
            sc = r.get("step_cost") or {}
            mb = sc.get("bytes_accessed")
            tmp = sc.get("temp_bytes")
            lines.append(
                f"| {r['size_label']} | {r['entry']} | {_tok(r.get('per_token_median_s'))} | "
                f"{_tok(r.get('per_token_min_s'))} | {_tok(r.get('per_token_max_s'))} | "
                f"{comp} | {after} | {'' if mb is None else f'{mb / 1e6:.1f}'} | "
                f"{'' if tmp is None else f'{tmp / 2**20:.1f}'} | "
                f"{_e((r.get('vs_plain') or {}).get('worst_rel_l2'))} | "
                f"{_e((r.get('vs_one_pass') or {}).get('worst_rel_l2'))} | {note} |")
        lines += ["", f"Ratios ours / plain per token (time: of the medians, checked for xla "
                      f"against {cfg['target']}; per round: median of the same-round ratios; "
                      f"min: of the fastest loops):", "",
                  "| B | ratio | time | time per round | min time | verdict |",
                  "|---:|---|---:|---:|---:|---|"]
        for row in doc["decode_ratios"]:
            verdict = {True: "PASS", False: "MISS", None: ""}[row.get("pass")]
            if row.get("pass") is None and "target" not in row:
                verdict = "(not checked)"
            lines.append(f"| {row['B']} | {row['label']} | {_r(row['time'])} | "
                         f"{_r(row.get('time (median per round)'))} | "
                         f"{_r(row.get('min time'))} | {verdict} |")
        lines.append("")
    if doc["prefill"]:
        lines += [f"## Chunked prefill ({cfg['prefill_size_label']}, forward, "
                  f"impl={cfg['prefill_impl']}, {cfg['dtype']})", "",
                  f"One public-API call on the whole rows against calls on pieces chaining "
                  f"the returned state (the first with state=None); median of "
                  f"{cfg['repeats']} timed runs, interleaved round by round, each right after "
                  f"{cfg['settle']} untimed run(s) of the same entry. Differences against "
                  f"the one pass: relative L2 (max |diff| / max |one pass|).", "",
                  "| entry | calls | median ms | min ms | max ms | first run s (compiles) "
                  "| o rel | conv rel | recurrent rel | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in doc["prefill"]:
            cmp_ = r.get("vs_one_pass") or {}
            cell = {k: (f"{_e(cmp_[k]['rel_l2'])} ({_e(cmp_[k]['max_abs_over_max_ref'])})"
                        if k in cmp_ else "") for k in ("o", "conv", "recurrent")}
            note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
            first = (f"{r['first_run_s']:.1f} ({r['first_run_compiles']})"
                     if "first_run_s" in r else "")
            lines.append(f"| {r['entry']} | {r['calls']} | {_ms(r.get('median_s'))} | "
                         f"{_ms(r.get('min_s'))} | {_ms(r.get('max_s'))} | {first} | "
                         f"{cell['o']} | {cell['conv']} | {cell['recurrent']} | {note} |")
        lines += ["", "| pieces / one pass | time | time per round | min time |",
                  "|---|---:|---:|---:|"]
        for row in doc["prefill_ratios"]:
            lines.append(f"| {row['label']} | {_r(row['time'])} | "
                         f"{_r(row.get('time (median per round)'))} | {_r(row.get('min time'))} |")
        lines.append("")
    if doc["acceptance"]:
        lines += ["## Decode acceptance", "", "| check | value | target | verdict |",
                  "|---|---:|---:|---|"]
        for a in doc["acceptance"]:
            verdict = {True: "PASS", False: "MISS", None: "not measured"}[a["pass"]]
            val = a["value"] if isinstance(a["value"], int) else _r(a["value"])
            lines.append(f"| {a['check']} | {val} | {a['target']} | {verdict} |")
        lines.append("")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """The whole file of a --decode-only run: the meta lines, then the section."""
    meta = doc["meta"]
    head = [
        "# gdn_kernels decode benchmark",
        "",
        f"- device: {meta['device_kind']} ({meta['platform']}, {meta['device_count']} device(s)),"
        f" {meta['cpu_count']} CPU cores; jax {meta['jax_version']}, jaxlib "
        f"{meta['jaxlib_version']}; pallas mode: {meta['pallas_mode']}; git {meta.get('git')}",
        f"- {meta['started']}, {meta['wall_s']:.0f} s; load average (1 min) "
        f"{meta['loadavg_start'][0]:.2f} at start, {meta['loadavg_end'][0]:.2f} at end",
        f"- command: `{meta['command']}`",
        "", "",
    ]
    return "\n".join(head) + markdown_section(doc["decode"]) + "\n"


def config_from_args(args, quick: bool) -> DecodeConfig:
    """DecodeConfig from the parsed command line of benchmarks/__main__.py."""
    parts = set(args.decode_parts)
    if args.decode_batches:
        sizes = tuple(Size.of(workloads.DECODE_LAYOUT, b, 1) for b in args.decode_batches)
    else:
        sizes = workloads.DECODE_QUICK_SIZES if quick else workloads.DECODE_SIZES
    return DecodeConfig(
        sizes=sizes,
        impls=tuple(args.decode_impls), steps=args.decode_steps,
        count_steps=args.decode_count_steps, repeats=args.decode_repeats,
        warmup=args.warmup, settle=args.settle, sync=args.decode_sync, dtype=args.dtype,
        chunk=args.chunk_size, seed=args.seed, time_budget_s=args.time_budget,
        decode="decode" in parts, prefill="prefill" in parts,
        prefill_size=workloads.PREFILL_QUICK_SIZE if quick else workloads.PREFILL_SIZE,
        prefill_pieces=(workloads.PREFILL_QUICK_PIECES if quick
                        else workloads.PREFILL_PIECES))
