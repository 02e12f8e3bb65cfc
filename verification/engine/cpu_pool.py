"""XLA:CPU's intra-op thread pool in the suite's processes: at least
MIN_THREADS threads, so that no two or three batched LAPACK calls running at
once can hold the whole pool waiting for each other.

jaxlib's CPU LAPACK kernels (the batched triangular solve of
`lax.linalg.triangular_solve` and `jax.scipy.linalg.solve_triangular`,
Cholesky, ...) split their batch over XLA:CPU's intra-op pool and wait for
the pieces inside the pool thread that runs them (`jax::ParallelBatchMap`).
XLA:CPU runs a program's independent operations at once on the same pool.
A program with as many independent batched solves as the pool has threads
can therefore hold every thread waiting for work no thread is left to do:
the process sits at 0% CPU for ever. The pool has one thread per core by
default, so on a 2-core machine two solves at once are enough (a chunked
kernel that solves its chunk matrix in the forward and again in its
backward has more than two).

The suite's processes run max(cores, MIN_THREADS) threads: the deadlock then
needs MIN_THREADS batched solves running at once in one program. A program
that has that many still deadlocks; the watchdog (watchdog.py) reports its
example as hung and names this wait from the native stacks. One thread
would rule the deadlock out, but a host callback that reads a JAX array
(the MLX and torch bridges) then waits for the one pool thread that runs
its own caller: that deadlock is certain, this one is bounded.

The pool's size is read once, when a process creates its CPU client, from
PJRT_NPROC (jaxlib's knob). `apply` sets it before the process's first XLA
computation (where the suite applies its compile settings); the processes
it starts (pytest-xdist, mesh and mutant workers, replays) inherit it. A
PJRT_NPROC already in the environment is the caller's choice and is kept,
and the run's header says so.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

ENV = "PJRT_NPROC"
# The fewest intra-op threads a suite process runs: a deadlock of batched
# LAPACK calls then needs this many at once in one program.
MIN_THREADS = 4
# The name XLA:CPU's intra-op pool gives its threads (tsl prefixes "tf_").
POOL_THREAD_NAME = "tf_XLAEigen"


def threads(cores: Optional[int] = None) -> int:
    """The suite's pool size on a machine of `cores` cores (default: this one's)."""
    return max(cores or os.cpu_count() or 1, MIN_THREADS)


def apply(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set PJRT_NPROC to threads() unless the environment sets it; returns a
    one-line description for the run's header."""
    own = environ.setdefault(ENV, str(threads()))
    if own == str(threads()):         # the suite's, set here or by the command that started us
        return (f"XLA:CPU intra-op pool: {own} threads ({ENV}; one per core, at least "
                f"{MIN_THREADS}: a deadlock of batched LAPACK calls needs {own} at once)")
    return (f"XLA:CPU intra-op pool: {ENV}={own} from the environment (a deadlock of batched "
            f"LAPACK calls needs {own} at once)")


def pool_threads() -> Optional[int]:
    """The number of XLA:CPU intra-op pool threads this process runs now
    (Linux: read from /proc; None elsewhere). 0 before the CPU client
    exists."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return None
    count = 0
    for tid in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, tid, "comm")) as f:
                count += f.read().strip() == POOL_THREAD_NAME
        except OSError:            # the thread ended while listed
            continue
    return count
