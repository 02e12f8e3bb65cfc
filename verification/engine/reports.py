"""One verdict from the reports of several shards of the suite.

Each shard (`--gdn-shard I/N`, run with GDN_STATS_FILE=<file>) writes its
exit status and per-property statistics as JSON (verification/plugin.py).
`gdn-verify merge-reports FILE...` sums them into one report: the verdict
fails if any shard failed, and per property the examples, failures,
compiles and seconds are summed and the worst row of each tensor kept.
"""

from __future__ import annotations

import json
from typing import List

from . import harness
from .shards import parse_shard, projection_line
from ..tolerance import TensorError


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def missing_shards(reports: List[dict]) -> List[str]:
    """The shards "I/N" absent from these reports (each names its shard; a
    report without one counts as 1/1), or a mismatch of N, as messages."""
    named = [parse_shard(r.get("shard") or "1/1") for r in reports]
    totals = sorted({n for _, n in named})
    if len(totals) > 1:
        return [f"reports of differently split runs: N in {totals}"]
    if not totals:
        return ["no report"]
    n = totals[0]
    seen = [i for i, _ in named]
    problems = [f"shard {i}/{n} missing" for i in range(1, n + 1) if i not in seen]
    problems += [f"shard {i}/{n} given twice" for i in sorted(set(seen)) if seen.count(i) > 1]
    return problems


def merge(paths: List[str]) -> dict:
    """The merged report of the shard reports at paths (all suite reports or
    all mutation reports); it fails when a shard's report is missing."""
    reports = [_load(p) for p in paths]
    if reports and all("mutants" in r for r in reports):
        merged = _merge_mutation(reports)
    else:
        merged = _merge_suite(reports)
    merged["missing"] = missing_shards(reports)
    if merged["missing"]:
        merged["passed"] = False
    return merged


def _merge_mutation(reports: List[dict]) -> dict:
    from ..mutants import MUTANTS
    from ..mutants.runner import kill_summary
    # the unsharded run's order: the catalog's mutants, each on its impls in
    # the order it declares them
    runs = [(name, impl) for name in MUTANTS for impl in MUTANTS[name].impls]
    order = {run: k for k, run in enumerate(runs)}
    results = sorted((m for r in reports for m in r["mutants"]),
                     key=lambda m: (order.get((m["mutant"], m["impl"]), len(order)),
                                    m["mutant"], m["impl"]))
    passed = all(r["baseline"]["passed"] for r in reports)
    replayed = sum(r["baseline"].get("replayed", 0) for r in reports)
    wall = max(r.get("wall_s", 0.0) for r in reports)
    verdict = kill_summary(results, passed, wall)
    return {"kind": "mutation", "shards": len(reports), "mutants": results,
            "baseline": {"passed": passed, "replayed": replayed}, **verdict}


def _merge_suite(reports: List[dict]) -> dict:
    merged: dict = {}
    exit_statuses, compiles, seconds = [], 0, {}
    for report in reports:
        exit_statuses.append(int(report["exitstatus"]))
        compiles += int(report.get("compiles", 0))
        seconds.update(report.get("test_seconds", {}))
        harness.merge_stats_json(report["properties"], into=merged)
    exitstatus = max(exit_statuses, default=1)
    return {"kind": "suite", "exitstatus": exitstatus, "shards": len(reports),
            "compiles": compiles, "properties": harness.stats_json(merged),
            "test_seconds": seconds,
            "passed": exitstatus == 0 and not any(st.failures for st in merged.values())}


def markdown(report: dict) -> str:
    """The merged report as a Markdown table and a verdict line (PASS / FAIL)."""
    if report["kind"] == "mutation":
        from ..mutants.runner import markdown as mutation_table
        table = mutation_table({"mutants": report["mutants"], "baseline": report["baseline"],
                                "summary": ""})
        missing = (f"FAIL: {'; '.join(report['missing'])}\n"
                   if report.get("missing") else "")
        return (table.rstrip() + f"\n\n{missing}{'PASS' if report['passed'] else 'FAIL'}: "
                f"{report['shards']} shard(s); {report['summary']}")
    lines = ["| property | verdict | examples | failures | compiles | compile s | seconds | "
             "worst ratio |", "|---|---|---|---|---|---|---|---|"]
    for name, st in sorted(report["properties"].items()):
        rows = [TensorError(**r) for r in st.get("worst", ())]
        worst = max((r.ratio for r in rows), default=0.0)
        lines.append(f"| {name} | {st.get('verdict') or '-'} | {st['examples']} | "
                     f"{st['failures']} | {st['compiles']} | "
                     f"{st.get('compile_s', 0.0):.1f} | "
                     f"{st['seconds']:.1f} | {worst:.2f} |")
    failed = [n for n, st in report["properties"].items() if st["failures"]]
    verdict = "PASS" if report["passed"] else "FAIL"
    lines.append("")
    if report.get("test_seconds"):
        lines.append(projection_line(list(report["test_seconds"].values()), "test-session"))
        lines.append("")
    if report.get("missing"):
        lines.append(f"FAIL: {'; '.join(report['missing'])}")
    lines.append(f"{verdict}: {report['shards']} shard(s), "
                 f"{sum(st['examples'] for st in report['properties'].values())} examples, "
                 f"{report['compiles']} XLA compiles"
                 + (f"; failing: {', '.join(sorted(failed))}" if failed else ""))
    return "\n".join(lines)
