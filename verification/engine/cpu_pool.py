"""One XLA:CPU intra-op thread in every process of the suite, so that no
kernel's wait inside that pool can deadlock a run.

XLA:CPU runs a program's independent operations at once on its intra-op
thread pool (one thread per core by default), and some library kernels it
calls split their own work over the same pool and wait for the pieces in
the pool thread that runs them: jaxlib's batched LAPACK triangular solve
(`lax.linalg.triangular_solve`, `jax.scipy.linalg.solve_triangular`) does.
Two such solves running at once on a 2-thread pool (a 2-core machine) hold
both threads and wait for each other for ever: the process sits at 0% CPU
in `block_until_ready`. With one pool thread no two waits can hold the pool
between them, and such a kernel does its work in the thread that runs it.

The pool's size is read once, when the process creates its CPU client,
from PJRT_NPROC (jaxlib's knob; NPROC as a fallback). `apply` sets
PJRT_NPROC=1 before the process's first XLA computation (where the suite
applies its compile settings); child processes (xdist workers, the mesh
worker, mutant workers, replays) inherit it. A PJRT_NPROC already in the
environment is the caller's choice and is kept, and the header says so.

The suite runs one process per core, so a single intra-op thread per
process leaves no core idle; XLA's multi-threaded Eigen matmuls and
concurrent operations inside one program are what it gives up.
"""

from __future__ import annotations

import os
from typing import MutableMapping, Optional

ENV = "PJRT_NPROC"
THREADS = "1"
# The name XLA:CPU's intra-op pool gives its threads (tsl prefixes "tf_").
POOL_THREAD_NAME = "tf_XLAEigen"


def apply(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set PJRT_NPROC=1 unless the environment sets it; returns a one-line
    description for the report header."""
    own = environ.setdefault(ENV, THREADS)
    if own == THREADS:
        return (f"XLA:CPU intra-op pool: {THREADS} thread per process ({ENV}={THREADS}: "
                f"no two batched LAPACK solves can wait on each other)")
    return (f"XLA:CPU intra-op pool: {ENV}={own} from the environment: a kernel calling a "
            f"batched LAPACK solve (lax.linalg.triangular_solve) may deadlock the run")


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
