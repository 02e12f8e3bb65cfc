"""One XLA:CPU intra-op thread per suite process (verification/engine/cpu_pool.py):
a program running several batched LAPACK triangular solves at once hangs
on a 2-thread pool and finishes in the suite's processes."""

import os
import subprocess
import sys
import threading
import time

import pytest

from verification.engine import cpu_pool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Three independent batched solves in one program: XLA:CPU runs them at once
# on its intra-op pool, and each splits its batch of 64 over that pool.
_SOLVES = """
import sys
import numpy as np
import jax
from jax import lax
from verification.engine import cpu_pool
cpu_pool.apply()

def solve(a, b):
    return lax.linalg.triangular_solve(a, b, left_side=True, lower=True,
                                       unit_diagonal=True)

@jax.jit
def three_solves(*args):
    return sum(solve(a, b).sum() for a, b in zip(args[::2], args[1::2]))

rng = np.random.default_rng(0)
args = []
for _ in range(3):
    args += [np.tril(rng.normal(size=(64, 64, 64))).astype(np.float32) * 0.1,
             rng.normal(size=(64, 64, 16)).astype(np.float32)]
for _ in range(int(sys.argv[1])):
    three_solves(*args).block_until_ready()
    print("ran", flush=True)
print("pool threads", cpu_pool.pool_threads())
"""


def _env(**extra):
    """This environment without the pool setting and without the persistent
    compile cache (a program written to and read from it ran 2,000 times on
    two pool threads in 3 of 3 processes: the cache is not what is tested)."""
    env = {k: v for k, v in os.environ.items()
           if k != cpu_pool.ENV and not k.startswith(("JAX_COMPILATION_CACHE",
                                                      "JAX_PERSISTENT_CACHE"))}
    env.update(extra)
    return env


def test_apply_sets_one_thread_and_keeps_the_callers_own():
    env = {}
    assert "no two batched LAPACK solves" in cpu_pool.apply(env)
    assert env == {cpu_pool.ENV: "1"}
    own = {cpu_pool.ENV: "4"}
    assert "may deadlock" in cpu_pool.apply(own)
    assert own == {cpu_pool.ENV: "4"}


@pytest.mark.skipif(cpu_pool.pool_threads() is None, reason="threads are read from Linux /proc")
def test_this_suite_process_runs_one_pool_thread():
    """The pytest process (the plugin applied cpu_pool before its first
    computation; under xdist, the worker) runs one intra-op thread."""
    import jax.numpy as jnp
    jnp.zeros(1).block_until_ready()
    assert os.environ.get(cpu_pool.ENV) == "1"
    assert cpu_pool.pool_threads() == 1


def test_concurrent_batched_solves_finish_in_a_suite_process():
    """1,000 runs of the program: 3-6 s on one pool thread."""
    proc = subprocess.run([sys.executable, "-c", _SOLVES, "1000"], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pool threads 1" in proc.stdout


def _hangs(env, runs=2000, stall_s=8.0) -> bool:
    """Whether the program stops making progress (no run finished for
    stall_s seconds: one run takes milliseconds) before its runs end."""
    proc = subprocess.Popen([sys.executable, "-c", _SOLVES, str(runs)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
    last = [time.monotonic()]

    def read():
        for _ in proc.stdout:
            last[0] = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() - last[0] > stall_s:
                return True
            time.sleep(0.5)
        return False
    finally:
        proc.kill()
        proc.wait()


def test_the_same_solves_hang_on_a_two_thread_pool():
    """The control: what the setting prevents (jaxlib 0.10, CPU). On two
    pool threads the program stops within its first runs in most processes
    (measured: 13 of 14 processes of 2,000 runs, with the machine's other
    core busy); three processes, one must hang."""
    env = _env(**{cpu_pool.ENV: "2"})
    assert any(_hangs(env) for _ in range(3))
