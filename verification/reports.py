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
from .tolerance import TensorError


def merge(paths: List[str]) -> dict:
    """The merged report of the shard reports at paths."""
    harness.STATS.clear()
    exit_statuses, compiles = [], 0
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        exit_statuses.append(int(report["exitstatus"]))
        compiles += int(report.get("compiles", 0))
        harness.merge_stats_json(report["properties"])
    return {"exitstatus": max(exit_statuses, default=1), "shards": len(paths),
            "compiles": compiles, "properties": harness.stats_json()}


def markdown(report: dict) -> str:
    """The merged report as a Markdown table and a verdict line."""
    lines = ["| property | examples | failures | compiles | seconds | worst ratio |",
             "|---|---|---|---|---|---|"]
    for name, st in sorted(report["properties"].items()):
        rows = [TensorError(**r) for r in st.get("worst", ())]
        worst = max((r.ratio for r in rows), default=0.0)
        lines.append(f"| {name} | {st['examples']} | {st['failures']} | {st['compiles']} | "
                     f"{st['seconds']:.1f} | {worst:.2f} |")
    failed = [n for n, st in report["properties"].items() if st["failures"]]
    verdict = "PASS" if report["exitstatus"] == 0 and not failed else "FAIL"
    lines.append("")
    lines.append(f"{verdict}: {report['shards']} shard(s), "
                 f"{sum(st['examples'] for st in report['properties'].values())} examples, "
                 f"{report['compiles']} XLA compiles"
                 + (f"; failing: {', '.join(sorted(failed))}" if failed else ""))
    return "\n".join(lines)
