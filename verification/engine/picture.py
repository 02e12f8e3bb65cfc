"""The picture of a run: properties x tensors, coloured by worst ratio.

One SVG (no plotting library), drawn from a run's JSON report
(harness.stats_json, as `gdn-verify --json` / `--gdn-report` write it):

  rows     the properties, labelled with their verdicts: the FAILED ones
           first, then known failures (XFAIL), then those that held; the
           not-checkable ones folded into one grey row per reason
  causes   under the grid, each failed property's causes (its failure
           classes' diagnosis: the changes under which they pass)
  columns  the tensors the rows compared (tolerance.tensor_of: `o`, `dx`,
           `final_state`, `dstate.conv` ...), in contract order, then the
           exact and structural checks in one column
  a cell   the worst ratio of that tensor's rows over the run (error over
           its bound: 1 is the bound), its colour on a log scale from
           green (1e-3 and below, far inside) through yellow (0.1) to orange
           (at the bound), red for a row beyond its bound; the number is written
           in the cell
  marks    "n/c" (grey) a tensor not checkable on the target; "T" a tensor
           that held only at the author's declared tolerance, "P" only at the
           declared precision (its ratio at the contract's bound is beside
           the verdict in the summary); "xf" a known failure

And the kill matrix of a mutation run (kill_matrix: mutant x property, every
property whose session killed the mutant, with the examples it took),
written as mutation-report.svg. Written beside every JSON report a run
writes (REPORT.svg); by hand (either report):

    python -m verification.engine.picture REPORT.json [OUT.svg]
"""

from __future__ import annotations

import html
import json
import math
import sys
from typing import Dict, List, Optional, Tuple

from ..tolerance import TensorError, tensor_of

# Tensors in the contract's order: outputs, then the core op's gradients,
# then the mixer's, then the carried state's.
TENSOR_ORDER = ("o", "final_state", "conv", "recurrent",
                "dq", "dk", "dv", "dg", "dbeta", "dinitial_state",
                "dx", "dconv_weight", "da", "db", "da_log", "ddt_bias",
                "dstate.conv", "dstate.recurrent")
STRUCTURAL = "exact / structural"

CELL_W, CELL_H = 52, 20
LABEL_W, HEADER_H, TITLE_H, LEGEND_H = 380, 96, 34, 70
FAILED_FILL, NOT_CHECKABLE_FILL, EMPTY_FILL = "#d7301f", "#bdbdbd", "#f7f7f7"
# (ratio, colour) stops on a log scale: far inside, halfway, at the bound
STOPS = ((1e-3, (229, 245, 224)), (1e-1, (254, 224, 139)), (1.0, (244, 109, 67)))


def colour(ratio: float) -> str:
    """The fill of a cell of this worst ratio (beyond 1: failed red)."""
    if ratio > 1.0:
        return FAILED_FILL
    x = math.log10(max(ratio, STOPS[0][0]))
    for (r0, c0), (r1, c1) in zip(STOPS, STOPS[1:]):
        x0, x1 = math.log10(r0), math.log10(r1)
        if x <= x1:
            t = (x - x0) / (x1 - x0)
            rgb = tuple(round(a + (b - a) * t) for a, b in zip(c0, c1))
            return "#%02x%02x%02x" % rgb
    return "#%02x%02x%02x" % STOPS[-1][1]


def _rows_of(st: dict) -> List[TensorError]:
    fields = TensorError.__dataclass_fields__
    return [TensorError(**{k: v for k, v in r.items() if k in fields}) for r in st["worst"]]


def cells(st: dict) -> Dict[str, dict]:
    """Per tensor column of one property: {"ratio", "mark"} (mark: "", "T",
    "P", "n/c")."""
    out: Dict[str, dict] = {}
    for row in _rows_of(st):
        structural = not row.bound_rel and not row.bound_abs
        column = STRUCTURAL if structural else tensor_of(row)
        cell = out.setdefault(column, {"ratio": 0.0, "mark": ""})
        cell["ratio"] = max(cell["ratio"], row.ratio)
    for tensor in st.get("tolerated", {}):
        out.setdefault(tensor, {"ratio": 0.0, "mark": ""})["mark"] = "T"
    for tensor in st.get("deviations", {}):
        out.setdefault(tensor, {"ratio": 0.0, "mark": ""})["mark"] = "P"
    for tensor in st.get("tensors_not_checkable", {}):
        out[tensor] = {"ratio": 0.0, "mark": "n/c"}
    return out


def columns(report: dict) -> List[str]:
    seen = {c for st in report["properties"].values() for c in cells(st)}
    known = [t for t in TENSOR_ORDER if t in seen]
    rest = sorted(seen - set(TENSOR_ORDER) - {STRUCTURAL})
    return known + rest + ([STRUCTURAL] if STRUCTURAL in seen else [])


def _verdict(st: dict) -> str:
    if st.get("known_failures"):
        return "XFAIL"
    return st.get("verdict") or "?"


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "start",
          weight: str = "normal", rotate: Optional[float] = None, fill: str = "#222") -> str:
    transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}"{transform}>{html.escape(s)}</text>')


def _ratio_text(ratio: float) -> str:
    if math.isinf(ratio):
        return "inf"
    if ratio == 0:
        return "0"
    if ratio >= 10:
        return f"{ratio:.0f}"
    return f"{ratio:.2f}" if ratio >= 0.01 else f"{ratio:.0e}".replace("e-0", "e-")


VERDICT_ORDER = ("FAILED", "XFAIL", "?", "held")


def _rows(props: dict) -> List[Tuple[str, dict]]:
    """The picture's rows: the properties that ran, FAILED first, then known
    failures, then those that held (each in the report's order); then one
    row per reason for the not-checkable properties, named together."""
    ran = [(n, st) for n, st in props.items() if _verdict(st) != "not checkable"]
    ran.sort(key=lambda item: VERDICT_ORDER.index(_verdict(item[1]))
             if _verdict(item[1]) in VERDICT_ORDER else len(VERDICT_ORDER))
    by_reason: Dict[str, List[str]] = {}
    for name, st in props.items():
        if _verdict(st) == "not checkable":
            by_reason.setdefault(next(iter(st.get("reasons", {})), ""), []).append(name)
    folded = [(f"{len(names)} not checkable",
               {"verdict": "not checkable", "reasons": {reason: 1}, "names": names})
              for reason, names in by_reason.items()]
    return ran + folded


def cause_lines(props: dict) -> List[str]:
    """One line per cause of each failed property (the diagnosis's changes
    that make its failure classes pass: verification/summary.py causes)."""
    from .diagnosis import causes
    lines = []
    for name, st in props.items():
        if _verdict(st) != "FAILED":
            continue
        for classes in causes(st.get("classes", {})).values():
            diagnosis = st["classes"][classes[0]].get("diagnosis")
            if diagnosis:
                lines.append(f"{name}: {diagnosis['cause']} ({len(classes)} failure "
                             f"class(es): {', '.join(classes)})")
    return lines


def svg(report: dict) -> str:
    """The picture of the run whose JSON report this is: the failed
    properties first, the not-checkable ones folded into a row per reason,
    the failures' causes under the grid."""
    props = report["properties"]
    cols = columns(report)
    rows = _rows(props)
    found = cause_lines(props)
    width = LABEL_W + CELL_W * max(len(cols), 1) + 150      # room for the slanted headers
    height = TITLE_H + HEADER_H + CELL_H * len(rows) + 16 * (len(found) + bool(found)) + LEGEND_H
    verdicts = [_verdict(st) for st in props.values()]
    counts = ", ".join(f"{v} {verdicts.count(v)}" for v in
                       ("held", "FAILED", "XFAIL", "not checkable") if verdicts.count(v))
    title = (f"gdn-verify on {report.get('target', '?')}, profile {report.get('profile', '?')}: "
             f"{counts}")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans Mono, Menlo, monospace">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           _text(10, 22, title, size=14, weight="bold")]
    top = TITLE_H + HEADER_H
    for j, c in enumerate(cols):
        x = LABEL_W + CELL_W * j + CELL_W / 2
        out.append(_text(x, top - 6, c, size=11, rotate=-40))
    for i, (name, st) in enumerate(rows):
        y = top + CELL_H * i
        verdict = _verdict(st)
        colour_of_label = FAILED_FILL if verdict == "FAILED" else "#222"
        if verdict == "not checkable":
            out.append(_text(LABEL_W - 8, y + 14, name, size=11, anchor="end"))
            out.append(f'<rect x="{LABEL_W}" y="{y}" width="{CELL_W * len(cols)}" '
                       f'height="{CELL_H}" fill="{NOT_CHECKABLE_FILL}" stroke="white"/>')
            reason = next(iter(st.get("reasons", {})), "")
            out.append(_text(LABEL_W + 6, y + 14, f"not checkable: {reason} "
                             f"({', '.join(st['names'])})"[:160], size=10))
            continue
        out.append(_text(LABEL_W - 8, y + 14, f"{name}  {verdict}", size=11, anchor="end",
                         fill=colour_of_label))
        row = cells(st)
        for j, c in enumerate(cols):
            x = LABEL_W + CELL_W * j
            cell = row.get(c)
            if cell is None:
                fill, label = EMPTY_FILL, ""
            elif cell["mark"] == "n/c":
                fill, label = NOT_CHECKABLE_FILL, "n/c"
            else:
                fill = colour(cell["ratio"])
                label = _ratio_text(cell["ratio"]) + (f" {cell['mark']}" if cell["mark"] else "")
            out.append(f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
                       f'fill="{fill}" stroke="white"/>')
            if label:
                ink = "white" if fill == FAILED_FILL else "#222"
                out.append(_text(x + CELL_W / 2, y + 14, label, size=9, anchor="middle", fill=ink))
        if verdict == "XFAIL":
            out.append(_text(LABEL_W + CELL_W * len(cols) + 4, y + 14, "xf", size=10))
    y = top + CELL_H * len(rows) + 16
    if found:
        out.append(_text(10, y, "causes (the changes under which the failure passes):",
                         size=11, weight="bold"))
        for line in found:
            y += 16
            out.append(_text(10, y, line[:200], size=10, fill=FAILED_FILL))
    out += _legend(y + 2)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(y: float) -> List[str]:
    out = [_text(10, y + 14, "worst ratio (error / bound):", size=11)]
    samples: Tuple[Tuple[float, str], ...] = ((1e-3, "<=0.001"), (1e-2, "0.01"), (1e-1, "0.1"),
                                              (0.5, "0.5"), (1.0, "1 (bound)"),
                                              (2.0, ">1 FAILED"))
    x = 230
    for ratio, label in samples:
        out.append(f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
                   f'fill="{colour(ratio)}"/>')
        out.append(_text(x + CELL_W / 2, y + CELL_H + 12, label, size=9, anchor="middle"))
        x += CELL_W + 14
    out.append(f'<rect x="{x + 10}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
               f'fill="{NOT_CHECKABLE_FILL}"/>')
    out.append(_text(x + 10 + CELL_W / 2, y + 14, "n/c", size=9, anchor="middle"))
    out.append(_text(x + 10 + CELL_W / 2, y + CELL_H + 12, "not checkable", size=9,
                     anchor="middle"))
    out.append(_text(10, y + 48, "T: held at the declared tolerance only   P: at the declared "
                                 "precision only   xf: known failure   blank: not compared",
                     size=10))
    return out


KILL_FILL, HELD_FILL = "#d7301f", "#e5f5e0"


def kill_matrix(report: dict) -> str:
    """The kill matrix of a mutation run (mutation-report.json): a row per
    mutant and impl, a column per property its sessions ran; a cell red
    with the examples it took where the property killed the mutant, pale
    green where it ran and held, blank where it did not run."""
    runs = [dict(r, kills=_kills_of(r)) for r in report["mutants"]]
    cols: List[str] = []
    for r in runs:
        for name in list(r["kills"]) + list(r.get("held", [])):
            if name not in cols:
                cols.append(name)
    cols.sort(key=lambda c: -sum(c in r["kills"] for r in runs))
    label_w, cell_w, header_h = 300, 40, 240
    width = label_w + cell_w * max(len(cols), 1) + 240
    height = TITLE_H + header_h + CELL_H * len(runs) + 60
    killed = sum(bool(r.get("killed")) for r in runs)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans Mono, Menlo, monospace">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           _text(10, 22, f"gdn-verify mutation run: {killed} of {len(runs)} killed "
                         f"(cell: examples to kill)", size=14, weight="bold")]
    top = TITLE_H + header_h
    for j, c in enumerate(cols):
        out.append(_text(label_w + cell_w * j + cell_w / 2, top - 6, c, size=11, rotate=-50))
    for i, r in enumerate(runs):
        y = top + CELL_H * i
        ink = "#222" if r.get("killed") else FAILED_FILL
        out.append(_text(label_w - 8, y + 14, f"{r['mutant']} {r['impl']}", size=10,
                         anchor="end", fill=ink))
        for j, c in enumerate(cols):
            x = label_w + cell_w * j
            if c in r["kills"]:
                fill, label = KILL_FILL, str(r["kills"][c])
            elif c in r.get("held", []):
                fill, label = HELD_FILL, ""
            else:
                fill, label = EMPTY_FILL, ""
            out.append(f'<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" '
                       f'fill="{fill}" stroke="white"/>')
            if label:
                out.append(_text(x + cell_w / 2, y + 14, label, size=9, anchor="middle",
                                 fill="white"))
        if not r.get("killed"):
            out.append(_text(label_w + cell_w * len(cols) + 6, y + 14, r["status"].upper(),
                             size=10, fill=FAILED_FILL))
    y = top + CELL_H * len(runs) + 24
    out += [f'<rect x="10" y="{y}" width="{cell_w}" height="{CELL_H}" fill="{KILL_FILL}"/>',
            _text(10 + cell_w + 6, y + 14, "killed it (examples to kill)", size=10),
            f'<rect x="260" y="{y}" width="{cell_w}" height="{CELL_H}" fill="{HELD_FILL}"/>',
            _text(260 + cell_w + 6, y + 14, "ran, held", size=10),
            f'<rect x="400" y="{y}" width="{cell_w}" height="{CELL_H}" fill="{EMPTY_FILL}"/>',
            _text(400 + cell_w + 6, y + 14, "not run", size=10), "</svg>"]
    return "\n".join(out) + "\n"


def _kills_of(run: dict) -> Dict[str, int]:
    """{property: examples to kill} of a mutant run (a report written
    before kills were recorded: its first killer)."""
    if "kills" in run:
        return run["kills"]
    return {run["killed_by"]: run["examples_to_kill"]} if run.get("killed_by") else {}


def write_kill_matrix(report: dict, path: str) -> str:
    with open(path, "w") as f:
        f.write(kill_matrix(report))
    return path


def beside(report_path: str) -> str:
    """Where the picture of the report at report_path goes: same name, .svg."""
    stem = report_path[:-5] if report_path.endswith(".json") else report_path
    return stem + ".svg"


def write(report: dict, path: str) -> str:
    with open(path, "w") as f:
        f.write(svg(report))
    return path


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        report = json.load(f)
    out = argv[1] if len(argv) > 1 else beside(argv[0])
    print(write_kill_matrix(report, out) if "mutants" in report else write(report, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
