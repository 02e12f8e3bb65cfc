"""Suite throughput: examples per second and compiles per property of the
verification suite under a Hypothesis profile.

pytest runs in a subprocess on a representative subset of the properties
(selected by id: --gdn-properties ID,ID,...), with GDN_STATS_FILE set so
the suite's plugin writes its per-property statistics (examples, seconds,
XLA compiles) as JSON. Its working directory is a temporary directory, so the dev profile's
example database (.hypothesis/examples, relative) and the counterexample
files start empty there and the checkout's are neither replayed nor written.
(GDN_HYPOTHESIS_DB is not used for that: the ci profile reads no database.)
The ci profile's example count is bounded with GDN_CI_EXAMPLES.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

# One or two properties of each kind, by id: forward parity, gradient parity
# (both ops), a metamorphic property, the reduced-gradient shape property.
DEFAULT_PROPERTIES = (
    "mixer_forward_parity",
    "delta_rule_forward_parity",
    "mixer_gradient_parity",
    "delta_rule_gradient_parity",
    "chunk_size_invariance",
    "cotangent_shapes_and_dtypes",
)
DEFAULT_CI_EXAMPLES = 16
# The suite's default target (what runs without --gdn-target).
DEFAULT_TARGET = "gdn_kernels:pallas"

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_profile(profile: str, *, target: Optional[str] = None,
                properties: Sequence[str] = DEFAULT_PROPERTIES,
                ci_examples: int = DEFAULT_CI_EXAMPLES,
                timeout_s: float = 1800.0, log: Callable[[str], None] = print) -> dict:
    """Run the selected properties under `profile`; returns a JSON-ready dict."""
    with tempfile.TemporaryDirectory(prefix="gdn-bench-suite-") as tmp:
        stats_path = os.path.join(tmp, "stats.json")
        env = dict(os.environ)
        env.pop("GDN_HYPOTHESIS_DB", None)
        env.update(GDN_PROFILE=profile, GDN_STATS_FILE=stats_path,
                   GDN_COUNTEREXAMPLES=os.path.join(tmp, "counterexamples"))
        if profile == "ci":
            env["GDN_CI_EXAMPLES"] = str(ci_examples)
        selection = ",".join(properties)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               os.path.join(REPO_ROOT, "verification"), "--gdn-properties", selection]
        if target:
            cmd += ["--gdn-target", target]
        log(f"suite[{profile}]: {' '.join(cmd[:7])} <{len(properties)} "
            f"properties> (GDN_PROFILE={profile}"
            + (f", GDN_CI_EXAMPLES={ci_examples}" if profile == "ci" else "") + ")")
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            rc = "timeout"
            output = (err.stdout or b"").decode(errors="replace") if isinstance(
                err.stdout, bytes) else (err.stdout or "")
        wall = time.perf_counter() - t0
        data = None
        if os.path.exists(stats_path):
            with open(stats_path) as f:
                data = json.load(f)

    result = {"profile": profile, "target": target or DEFAULT_TARGET,
              "selection": list(properties),
              "command": " ".join(cmd), "ci_examples": ci_examples if profile == "ci" else None,
              "returncode": rc, "wall_s": wall, "loadavg_1m_start": load0,
              "loadavg_1m_end": os.getloadavg()[0], "properties": {}}
    if data is None:
        result["error"] = "no stats file written; output tail:\n" + output[-2000:]
        return result
    total_ex = total_s = 0.0
    for name, st in sorted(data["properties"].items()):
        ex, sec, comp = st["examples"], st["seconds"], st["compiles"]
        total_ex += ex
        total_s += sec
        result["properties"][name] = {
            "examples": ex, "failures": st["failures"], "seconds": sec, "compiles": comp,
            "examples_per_s": ex / sec if sec > 0 else None,
            "compiles_per_example": comp / ex if ex else None}
    result["examples"] = int(total_ex)
    result["compiles"] = int(data.get("compiles", 0))
    result["seconds_in_properties"] = total_s
    result["examples_per_s"] = total_ex / wall if wall > 0 else None
    result["examples_per_s_in_properties"] = total_ex / total_s if total_s > 0 else None
    result["compiles_per_property"] = (result["compiles"] / len(result["properties"])
                                       if result["properties"] else None)
    if rc != 0:
        result["output_tail"] = output[-2000:]
    return result


def run(profiles=("dev", "ci"), **kw) -> dict:
    return {p: run_profile(p, **kw) for p in profiles}
