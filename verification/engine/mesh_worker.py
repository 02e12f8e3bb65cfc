"""Checks that need more devices than this process has, run in a worker.

On a CPU a process gets N devices only when XLA_FLAGS asks for them before
jax is imported; the suite itself keeps one. A property declared with
devices=8, or any property on a sharded target (MODULE:IMPL@data=4,...),
therefore runs its check in one long-lived worker process started with
--xla_force_host_platform_device_count (one per device count, kept for the
session, so its compiles are reused). The worker receives (property id,
target spec, case) as one JSON line and answers the rows, or the exception,
as one JSON line; the caller concludes the verdict as for an in-process check.

    python -m verification.engine.mesh_worker     # the worker's loop (stdin/stdout)
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys
from typing import Dict, List

from strategies.cases import case_from_json, case_to_json

from . import runners
from ..targets.declaration import OutsideLimits, precision_of
from .registry import conclude, not_checkable_row
from ..tolerance import TensorError, at_declared_tolerance, declared_precision

_WORKERS: Dict[int, subprocess.Popen] = {}


class WorkerError(RuntimeError):
    """The check raised in the worker (type and message), or the worker died."""


def devices_needed(prop, target) -> int:
    return max(prop.devices, target.devices)


def run(prop, target, case) -> List[TensorError]:
    """Check one case of property `prop` (tiled to a sharded target's mesh,
    in a mesh worker when this process lacks the devices): the rows, or
    PropertyFailure when a row fails (judged at the target's declared
    tolerance, where it declares one). A case the target cannot take is one
    not-checkable row; the target is not called."""
    reason = prop.not_checkable(target, case)
    if reason:
        return [not_checkable_row(prop.id, reason)]
    try:
        rows = check(prop, target, case)
    except OutsideLimits as err:
        return [not_checkable_row(prop.id, f"the check calls the target outside its declared "
                                           f"limits ({err})")]
    return conclude(prop.id, at_declared_tolerance(rows, target.declaration.tolerance))


def check(prop, target, case) -> List[TensorError]:
    """The rows of prop's check on case (tiled to a sharded target's mesh), in
    this process when it has the devices, else in the worker."""
    import jax
    needed = devices_needed(prop, target)
    if needed <= jax.device_count():
        return check_here(prop, target, target.fit(case))
    return _ask(needed, {"property": prop.id, "target": target.spec,
                         "case": case_to_json(case)})


def check_here(prop, target, case) -> List[TensorError]:
    """prop's check on case in this process, judged at the precision the
    target declares for it (tolerance.declared_precision)."""
    with declared_precision(precision_of(target.declaration, case)):
        return prop.check(target, case)


def _worker(devices: int) -> subprocess.Popen:
    proc = _WORKERS.get(devices)
    if proc is not None and proc.poll() is None:
        return proc
    from ..mutants import mutant_root
    env = dict(os.environ, GDN_MUTANT_DIR=mutant_root(),
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={devices}").strip())
    proc = subprocess.Popen([sys.executable, "-m", "gdn_verify.run",
                             "verification.engine.mesh_worker"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                            text=True, bufsize=1)
    _WORKERS[devices] = proc
    return proc


def _ask(devices: int, request: dict) -> List[TensorError]:
    proc = _worker(devices)
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        _WORKERS.pop(devices, None)
        raise WorkerError(f"the {devices}-device worker exited (code {proc.wait()}) while "
                          f"checking {request['property']} on {request['target']}")
    answer = json.loads(line)
    runners.count_worker_compiles(answer.get("compiles", 0), answer.get("compile_s", 0.0))
    if "error" in answer:
        raise WorkerError(f"in the {devices}-device worker: {answer['error']}")
    return [TensorError(**row) for row in answer["rows"]]


@atexit.register
def _stop_workers():
    for proc in _WORKERS.values():
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=60)


def _serve() -> None:
    """Answer requests until stdin closes; nothing but answers goes to stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr
    from ..properties import load_all
    from ..targets import Target
    properties = load_all()
    for line in sys.stdin:
        request = json.loads(line)
        c0, s0 = runners.compile_count(), runners.compile_seconds()
        try:
            target = Target.parse(request["target"])
            case = target.fit(case_from_json(request["case"]))
            rows = check_here(properties[request["property"]], target, case)
            answer = {"rows": [dataclasses.asdict(r) for r in rows]}
        except Exception as err:  # noqa: BLE001 - sent back, raised by the caller
            answer = {"error": f"{type(err).__name__}: {err}"}
        finally:
            runners.release_executables_if_needed()
        answer["compiles"] = runners.compile_count() - c0
        answer["compile_s"] = runners.compile_seconds() - s0
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
