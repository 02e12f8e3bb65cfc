"""Derived figures and output: ratios between impls (within one run), log-log
growth exponents in T, the acceptance checks, and the JSON / Markdown / PNG
files."""

from __future__ import annotations

import json
import math
from typing import Dict, List, Optional

from benchmarks import accuracy
from benchmarks.workloads import ACCEPTANCE_SIZE, Size

MiB = float(1 << 20)

# (numerator, denominator) impl pairs reported side by side.
RATIO_PAIRS = (("xla", "reference"), ("xla", "xla-autodiff"), ("xla", "plain-chunked"),
               ("pallas", "xla"))

# Acceptance targets (fwd+bwd, float32, at ACCEPTANCE_SIZE; growth over the ladder).
TARGETS = {
    "xla/reference time": 0.5,
    "xla/reference temp memory": 1.0 / 8.0,
    "xla/xla-autodiff time": 1.0,
    "xla/plain-chunked time": 0.8,
    "xla/plain-chunked temp memory": 1.0,
    "pallas/xla time": 1.0,
    "xla time exponent in T": 1.10,
    "xla temp memory exponent in T": 1.15,
    "packed/unpacked time": 1.15,   # per impl (xla, pallas), benchmarks/packed.py
}

PACKED_IMPLS = ("xla", "pallas")


def _index(records) -> Dict[tuple, dict]:
    return {(r["size_label"], r["op"], r["mode"], r["impl"]): r for r in records}


def _div(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def ratios(records: List[dict]) -> List[dict]:
    """Per (size, op, mode): time (median) and temp-memory ratios of RATIO_PAIRS."""
    idx = _index(records)
    keys = []
    for r in records:
        k = (r["size_label"], r["op"], r["mode"])
        if k not in keys:
            keys.append(k)
    out = []
    for size_label, op, mode in keys:
        row = {"size_label": size_label, "op": op, "mode": mode}
        for num, den in RATIO_PAIRS:
            a, b = idx.get((size_label, op, mode, num)), idx.get((size_label, op, mode, den))
            if a is None or b is None:
                continue
            row[f"{num}/{den} time"] = _div(a.get("median_s"), b.get("median_s"))
            row[f"{num}/{den} temp memory"] = _div(a.get("temp_bytes"), b.get("temp_bytes"))
        out.append(row)
    return out


def _slope(xs, ys) -> Optional[float]:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def growth_fits(records: List[dict]) -> List[dict]:
    """Log-log exponent of time (median, timed entries) and of compiled temp
    memory (every compiled entry, skipped ones too) in T, per (op, impl,
    mode) and size family (fixed B, Hk, Hv, Dk, Dv). `last_step` is the
    exponent between the two largest T."""
    groups: Dict[tuple, List[dict]] = {}
    for r in records:
        groups.setdefault((r["op"], r["impl"], r["mode"], r["family"]), []).append(r)
    out = []
    for (op, impl, mode, family), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["T"])
        row = {"op": op, "impl": impl, "mode": mode, "family": family}
        for what, key, sel in (("time", "median_s", lambda r: r["status"] == "ok"),
                               ("temp memory", "temp_bytes", lambda r: r.get("temp_bytes"))):
            pts = [(r["T"], r[key]) for r in rs if sel(r) and r.get(key)]
            row[f"{what} T"] = [p[0] for p in pts]
            row[f"{what} exponent"] = _slope(*zip(*pts)) if len(pts) >= 2 else None
            row[f"{what} last_step"] = (_slope(*zip(*pts[-2:])) if len(pts) >= 2 else None)
        if row["time exponent"] is None and row["temp memory exponent"] is None:
            continue
        out.append(row)
    return out


def _verdict(value, target) -> dict:
    if value is None:
        return {"value": None, "target": target, "pass": None}
    return {"value": value, "target": target, "pass": bool(value <= target),
            "margin": value / target}


def acceptance(records: List[dict], fits: List[dict],
               size: Size = ACCEPTANCE_SIZE, mode: str = "fwd+bwd") -> List[dict]:
    """The issue's targets per op, at `size` (fwd+bwd); growth exponents of
    xla over the ladder family of `size`."""
    idx = _index(records)
    out = []
    ops = sorted({r["op"] for r in records}, key=["delta_rule", "mixer"].index)
    for op in ops:
        get = lambda impl: idx.get((size.label, op, mode, impl), {})  # noqa: E731
        ref, xla, auto, pal, plain = (get(i) for i in ("reference", "xla", "xla-autodiff",
                                                       "pallas", "plain-chunked"))
        checks = {
            "xla/reference time": _div(xla.get("median_s"), ref.get("median_s")),
            "xla/reference temp memory": _div(xla.get("temp_bytes"), ref.get("temp_bytes")),
            "xla/xla-autodiff time": _div(xla.get("median_s"), auto.get("median_s")),
            "xla/plain-chunked time": _div(xla.get("median_s"), plain.get("median_s")),
            "xla/plain-chunked temp memory": _div(xla.get("temp_bytes"),
                                                  plain.get("temp_bytes")),
            "pallas/xla time": _div(pal.get("median_s"), xla.get("median_s")),
        }
        fit = next((f for f in fits if f["op"] == op and f["impl"] == "xla"
                    and f["mode"] == mode and f["family"] == size.family_label), None)
        checks["xla time exponent in T"] = fit and fit["time exponent"]
        checks["xla temp memory exponent in T"] = fit and fit["temp memory exponent"]
        for name, value in checks.items():
            row = {"op": op, "size_label": size.label, "mode": mode, "check": name}
            row.update(_verdict(value, TARGETS[name]))
            if name.endswith("in T") and fit:
                row["fit_T"] = fit["time T" if "time" in name else "temp memory T"]
                row["last_step"] = fit["time last_step" if "time" in name
                                       else "temp memory last_step"]
            out.append(row)
    return out


def packed_acceptance(packed: Optional[dict], ops) -> List[dict]:
    """packed/unpacked fwd+bwd time per (op, impl in xla, pallas) from the
    packed-overhead section (benchmarks/packed.py); "not measured" rows for
    `ops` when it did not run."""
    out = []
    rows = {(r["op"], r["impl"]): r for r in (packed or {}).get("ratios", [])}
    label = (packed or {}).get("size_label", ACCEPTANCE_SIZE.label)
    ops = list(dict.fromkeys(list(ops) + [op for op, _ in rows]))
    for op in sorted(ops, key=["delta_rule", "mixer"].index):
        for impl in PACKED_IMPLS:
            r = rows.get((op, impl), {})
            check = f"{impl} packed/unpacked time"
            if label != ACCEPTANCE_SIZE.label:
                check += f" at {label}"
            row = {"op": op, "size_label": label, "mode": "fwd+bwd", "check": check}
            row.update(_verdict(r.get("packed/unpacked time"),
                                TARGETS["packed/unpacked time"]))
            if r.get("packed/unpacked time (median per round)") is not None:
                row["per_round_median"] = r["packed/unpacked time (median per round)"]
            out.append(row)
    return out


# --------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------

def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False, default=str)


def _ms(x):
    return "" if x is None else (f"{x * 1e3:.1f}" if x >= 0.01 else f"{x * 1e3:.2f}")


def _mib(x):
    return "" if x is None else f"{x / MiB:.1f}"


def _r(x, digits=2):
    return "" if x is None else f"{x:.{digits}f}"


def markdown(doc: dict) -> str:
    meta, cfg = doc["meta"], doc["config"]
    lines = [
        "# gdn_kernels benchmark",
        "",
        f"- device: {meta['device_kind']} ({meta['platform']}, {meta['device_count']} device(s)),"
        f" {meta['cpu_count']} CPU cores; jax {meta['jax_version']}, jaxlib "
        f"{meta['jaxlib_version']}; pallas mode: {meta['pallas_mode']}",
        f"- {meta['started']}, {meta['wall_s']:.0f} s; load average (1 min) "
        f"{meta['loadavg_start'][0]:.2f} at start, {meta['loadavg_end'][0]:.2f} at end",
        f"- dtype {cfg['dtype']}, chunk {cfg['chunk']}, seed {cfg['seed']}; median of "
        f"{cfg['repeats']} timed runs after {cfg['warmup']} warm-up run(s); impls interleaved "
        f"round by round, each timed run right after {cfg.get('settle', 0)} untimed run(s) of "
        f"the same function; budgets per entry: {cfg['time_budget_s']:.0f} s, "
        f"{cfg['mem_budget_bytes'] / (1 << 30):.1f} GiB",
        "- fwd+bwd = jax.grad of sum(outputs * fixed random cotangents) w.r.t. every input; "
        "temp = compiled temp_size_in_bytes (memory_analysis); rel err = max over outputs "
        "of the relative L2 distance to the reference's outputs (to xla's when the "
        "reference did not run)",
        "- xla-autodiff = plain jax.grad through gdn_kernels.xla_impl.forward "
        "(no custom VJP); plain-chunked = benchmarks/plain_chunked.py, the chunked "
        "JAX a user would write first (float32 cumsum decay, WY, scan) with plain jax.grad",
        "",
    ]
    if doc["results"]:
        lines += ["## Time and memory", "",
                  "| size | op | mode | impl | median ms | min ms | max ms | compile s "
                  "| temp MiB | rel err | note |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in doc["results"]:
            note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
            err = r.get("rel_err_vs_reference", r.get("rel_err_vs_xla"))
            lines.append(
                f"| {r['size_label']} | {r['op']} | {r['mode']} | {r['impl']} | "
                f"{_ms(r.get('median_s'))} | {_ms(r.get('min_s'))} | {_ms(r.get('max_s'))} | "
                f"{_r(r.get('compile_total_s'), 1)} | {_mib(r.get('temp_bytes'))} | "
                f"{'' if err is None else f'{err:.1e}'} | {note} |")
        lines += ["", "## Ratios (same run, interleaved)", ""]
        pairs = [f"{a}/{b}" for a, b in RATIO_PAIRS]
        lines.append("| size | op | mode | " + " | ".join(
            f"{p} time | {p} mem" for p in pairs) + " |")
        lines.append("|---|---|---|" + "---:|" * (2 * len(pairs)))
        for row in doc["ratios"]:
            cells = []
            for p in pairs:
                cells += [_r(row.get(f"{p} time")), _r(row.get(f"{p} temp memory"), 3)]
            lines.append(f"| {row['size_label']} | {row['op']} | {row['mode']} | "
                         + " | ".join(cells) + " |")
        lines += ["", "## Growth in T (log-log least-squares exponent; last step = two "
                      "largest T)", "",
                  "| op | impl | mode | family | T (time) | time exp | last step "
                  "| T (mem) | mem exp | last step |",
                  "|---|---|---|---|---|---:|---:|---|---:|---:|"]
        for f in doc["fits"]:
            tt, mt = f["time T"], f["temp memory T"]
            lines.append(
                f"| {f['op']} | {f['impl']} | {f['mode']} | {f['family']} | "
                f"{tt[0] if tt else ''}..{tt[-1] if tt else ''} | {_r(f['time exponent'])} | "
                f"{_r(f['time last_step'])} | {mt[0] if mt else ''}..{mt[-1] if mt else ''} | "
                f"{_r(f['temp memory exponent'])} | {_r(f['temp memory last_step'])} |")
    if doc.get("accuracy"):
        lines += accuracy.markdown_section(doc["accuracy"])
    packed = doc.get("packed")
    if packed:
        lay = packed["layout"]
        lines += ["", f"## Packed overhead ({packed['size_label']}, {packed['mode']}, "
                      f"{packed['dtype']}, chunk {packed['chunk']})", "",
                  f"segment_ids: {lay['documents_per_row']} documents per row, padding "
                  f"{100 * lay['padding_fraction']:.1f} % of the tokens; runs (document "
                  f"lengths, [pad n] = padding): {lay['text']}.", "",
                  f"Median of {packed['repeats']} timed runs after {packed['warmup']} "
                  f"warm-up run(s); the unpacked (segment_ids=None) and packed entries of "
                  f"an op are interleaved round by round, each timed run right after "
                  f"{packed['settle']} untimed run(s) of the same entry.", "",
                  "| op | impl | variant | median ms | min ms | max ms | compile s "
                  "| temp MiB | rel err vs xla | padding grads 0 | note |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in packed["results"]:
            note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason']}"
            err = r.get("rel_err_vs_xla")
            zero = {True: "yes", False: "NO", None: ""}[r.get("padding_grads_zero")]
            lines.append(
                f"| {r['op']} | {r['impl']} | {r['variant']} | {_ms(r.get('median_s'))} | "
                f"{_ms(r.get('min_s'))} | {_ms(r.get('max_s'))} | "
                f"{_r(r.get('compile_total_s'), 1)} | {_mib(r.get('temp_bytes'))} | "
                f"{'' if err is None else f'{err:.1e}'} | {zero} | {note} |")
        lines += ["", "Ratios packed / unpacked (time: of the medians, the checked figure; "
                      "per round: median of the ratios of the two variants' runs in the "
                      "same round; min: of the fastest runs):", "",
                  "| op | impl | time | time per round | min time | temp memory | flops "
                  "| compile time |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in packed["ratios"]:
            lines.append(
                f"| {row['op']} | {row['impl']} | {_r(row.get('packed/unpacked time'), 3)} | "
                f"{_r(row.get('packed/unpacked time (median per round)'), 3)} | "
                f"{_r(row.get('packed/unpacked min time'), 3)} | "
                f"{_r(row.get('packed/unpacked temp_bytes'), 3)} | "
                f"{_r(row.get('packed/unpacked flops'), 3)} | "
                f"{_r(row.get('packed/unpacked compile_total_s'), 2)} |")
    if doc.get("acceptance"):
        lines += ["", f"## Acceptance ({ACCEPTANCE_SIZE.label}, fwd+bwd, {cfg['dtype']})", "",
                  "| op | check | value | target | verdict |", "|---|---|---:|---:|---|"]
        for a in doc["acceptance"]:
            verdict = {True: "PASS", False: f"MISS ({_r(a.get('margin'))}x the target)",
                       None: "not measured"}[a["pass"]]
            lines.append(f"| {a['op']} | {a['check']} | {_r(a['value'], 3)} | "
                         f"{_r(a['target'], 3)} | {verdict} |")
    suite = doc.get("suite")
    if suite:
        lines += ["", "## Suite throughput", ""]
        if meta.get("suite_from"):
            lines += [f"(from the run of {meta['suite_from']['started']}, "
                      f"{meta['suite_from']['file']})", ""]
        for prof, s in suite.items():
            lines.append(f"### profile {prof} (target {s['target']}"
                         + (f", GDN_CI_EXAMPLES={s['ci_examples']}" if s.get("ci_examples") else "")
                         + f"; exit {s['returncode']}, wall {s['wall_s']:.0f} s, load "
                           f"{s['loadavg_1m_start']:.1f} -> {s['loadavg_1m_end']:.1f})")
            lines.append("")
            if "error" in s:
                lines += ["```", s["error"], "```", ""]
                continue
            lines += ["| property | examples | seconds | examples/s | compiles | "
                      "compiles/example |", "|---|---:|---:|---:|---:|---:|"]
            for name, p in s["properties"].items():
                lines.append(f"| {name} | {p['examples']} | {p['seconds']:.1f} | "
                             f"{_r(p['examples_per_s'])} | {p['compiles']} | "
                             f"{_r(p['compiles_per_example'])} |")
            lines.append(f"| **total** | {s['examples']} | {s['seconds_in_properties']:.1f} | "
                         f"{_r(s['examples_per_s_in_properties'])} | {s['compiles']} | "
                         f"{_r(s['compiles'] / s['examples'] if s['examples'] else None)} |")
            lines += ["", f"{_r(s['examples_per_s'])} examples/s over the whole pytest "
                          f"process (collection and imports included); "
                          f"{_r(s['compiles_per_property'], 1)} compiles per property.", ""]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> Optional[str]:
    """time vs T and temp memory vs T per impl, log-log; None if written,
    else the reason it was not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("matplotlib is not installed (pip install -e '.[bench]'): "
                "no plot written")
    records = doc["results"]
    panels = []
    for op in ("delta_rule", "mixer"):
        for mode in ("fwd", "fwd+bwd"):
            if any(r["op"] == op and r["mode"] == mode for r in records):
                panels.append((op, mode))
    if not panels:
        return "no results to plot"
    impls = [i for i in ("reference", "xla", "xla-autodiff", "pallas", "plain-chunked")
             if any(r["impl"] == i for r in records)]
    families = sorted({r["family"] for r in records})
    styles = ["-", "--", ":", "-."]
    colors = {"reference": "tab:red", "xla": "tab:blue", "xla-autodiff": "tab:green",
              "pallas": "tab:purple", "plain-chunked": "tab:orange"}
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for row, (op, mode) in enumerate(panels):
        for col, (key, scale, label) in enumerate((("median_s", 1e3, "median time (ms)"),
                                                   ("temp_bytes", 1 / MiB, "temp memory (MiB)"))):
            ax = axes[row][col]
            for impl in impls:
                for fi, fam in enumerate(families):
                    rs = sorted((r for r in records if r["op"] == op and r["mode"] == mode
                                 and r["impl"] == impl and r["family"] == fam
                                 and r.get(key) and (key != "median_s" or r["status"] == "ok")),
                                key=lambda r: r["T"])
                    if not rs:
                        continue
                    ax.plot([r["T"] for r in rs], [r[key] * scale for r in rs],
                            styles[fi % len(styles)], marker="o", ms=3,
                            color=colors.get(impl), label=f"{impl} {fam}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("T")
            ax.set_ylabel(label)
            ax.set_title(f"{op} {mode}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=6, ncol=2)
    meta = doc["meta"]
    fig.suptitle(f"gdn_kernels on {meta['device_kind']} ({meta['platform']}), "
                 f"jax {meta['jax_version']}, {doc['config']['dtype']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
