"""One Python process that runs the mutation run's suite sessions one after
another: `python -m verification.mutants.worker`, started by the runner,
one per job slot.

A mutant's session used to be a fresh process: about 2.4 s of imports (jax,
pytest, the registry) before its first example, for 66 mutants, and each
rebuilt the programs of code its patch did not touch (the float64 oracle,
the reference), which the previous mutant had just built. Here each session
is `pytest.main` in this process: the imports happen once and the oracle's
programs stay compiled from one mutant to the next. What a session sees is
unchanged: the same arguments, its own stats file and counterexample folder,
a fresh plugin Suite and Hypothesis run (the kill profile is derandomized
and has no database, so a session draws the same examples as in a fresh
process); each mutant is its own package (gdn_mutant_<name>), so no mutated
code is ever shared.

The baseline's replays of the killing examples on the unmutated package
run here too (kind "cli": `gdn-verify replay FILE... --module gdn_kernels`),
after the mutants: gdn_kernels is its own package, untouched by any mutant.

Protocol: one JSON job per stdin line, {"kind": "pytest" or "cli", "args":
[arguments], "env": {name: value or null}}; one JSON result per stdout
line, {"returncode", "wall_s", "tail"}. pytest's output is captured per session (its last
characters are the result's tail); anything written below Python (XLA's
logs) goes to stderr, never into the protocol.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time


def run_session(args, env, kind: str = "pytest") -> dict:
    """One pytest session (kind "pytest": pytest's arguments) or one
    `gdn-verify` command (kind "cli": its arguments, e.g. the baseline's
    replay) with these environment changes."""
    import pytest
    from verification.cli import main as cli_main
    entry = {"pytest": pytest.main, "cli": cli_main}[kind]
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    log = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            code = int(entry(list(args)))
    except BaseException as err:             # noqa: BLE001 -- reported as the session's error
        code = 3
        log.write(f"\nworker: the session raised {type(err).__name__}: {err}\n")
    return {"returncode": code, "wall_s": time.perf_counter() - t0,
            "tail": log.getvalue()[-3000:]}


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                            # stray native output goes to stderr
    sys.stdout = sys.__stdout__ = os.fdopen(1, "w", closefd=False)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        result = run_session(job["args"], job.get("env", {}), job.get("kind", "pytest"))
        protocol.write(json.dumps(result) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
