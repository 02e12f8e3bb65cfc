"""Counterexample files: the shrunk failing case of a property, written as
counterexamples/<property>-<hash>.json, and replayed by
`gdn-verify replay FILE [--target MODULE[:IMPL]]`.

A file records what the failure was found under, so a replay runs the same
programs: the target spec, the Pallas interpret mode, the environment that
decides how XLA compiles (RECORDED_ENV: XLA_FLAGS among them), and the
versions of jax, jaxlib, Hypothesis and Python."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from typing import Optional

from strategies.cases import case_from_json, case_to_json

DIRECTORY_ENV = "GDN_COUNTEREXAMPLES"
# The environment a failure depends on: how Pallas kernels run, how XLA
# compiles (flags, the suite's fast-compile opt-out), JAX's precision mode,
# XLA:CPU's intra-op pool size (PJRT_NPROC: how matmuls split their work).
RECORDED_ENV = ("GDN_INTERPRET", "XLA_FLAGS", "GDN_XLA_DEFAULTS", "JAX_ENABLE_X64",
                "JAX_DEFAULT_MATMUL_PRECISION", "JAX_PLATFORMS", "PJRT_NPROC")


def directory() -> str:
    return os.environ.get(DIRECTORY_ENV, "counterexamples")


def recorded_environment(environ=os.environ) -> dict:
    """The RECORDED_ENV variables as set now (unset ones are None)."""
    return {name: environ.get(name) for name in RECORDED_ENV}


def _interpret_mode() -> str:
    from gdn_kernels.interpret import resolved_mode
    return resolved_mode()


def versions() -> dict:
    import hypothesis
    import jax
    import jaxlib
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "hypothesis": hypothesis.__version__, "python": platform.python_version()}


def _git_commit() -> Optional[str]:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write(prop: str, case, target: str, profile: str, rows, table: str,
          folder: Optional[str] = None, failure_class: str = "",
          diagnosis: Optional[dict] = None) -> str:
    """Write one counterexample file; returns its path. failure_class:
    tolerance.failure_class of the failure (one file per class); diagnosis:
    the case's (diagnosis.Diagnosis.to_json), where one was made."""
    case_json = case_to_json(case)
    key = json.dumps({"case": case_json, "target": target}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    folder = folder or directory()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{prop}-{digest}.json")
    record = {
        "property": prop, "failure_class": failure_class,
        "case": case_json, "target": target, "profile": profile,
        "error_table": [r.to_json() for r in rows], "error_table_text": table,
        "interpret_mode": _interpret_mode(), "environment": recorded_environment(),
        "versions": versions(), "git_commit": _git_commit(), "diagnosis": diagnosis,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    # written whole under a temporary name, then renamed: pytest-xdist
    # workers and shard jobs sharing the folder never see a partial file
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2, default=str)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def write_detail(prop: str, text: str, folder: Optional[str] = None) -> str:
    """Write a failed property's whole report (its failures' error tables,
    tracebacks and captured output) as <folder>/<prop>.failure.txt, beside
    its counterexample files; returns its path. The terminal shows one line
    per failure and this file's path."""
    folder = folder or directory()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{prop}.failure.txt")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".txt", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def load(path: str) -> dict:
    with open(path) as f:
        record = json.load(f)
    record["case_obj"] = case_from_json(record["case"])
    return record


def replay_command(path: str) -> str:
    return f"gdn-verify replay {path}"
