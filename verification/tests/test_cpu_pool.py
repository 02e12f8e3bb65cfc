"""XLA:CPU's intra-op pool in the suite's processes (verification/engine/cpu_pool.py):
a program running three batched LAPACK triangular solves at once hangs on a
2-thread pool and finishes on the suite's; a hang in that wait is named
from the native stacks (watchdog.known_wait)."""

import os
import subprocess
import sys
import threading
import time

import pytest

from verification.engine import cpu_pool, watchdog

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
    compile cache (a program read from it ran 2,000 times on two pool
    threads in 3 of 3 processes: the cache is not what is tested)."""
    env = {k: v for k, v in os.environ.items()
           if k != cpu_pool.ENV and not k.startswith(("JAX_COMPILATION_CACHE",
                                                      "JAX_PERSISTENT_CACHE"))}
    env.update(extra)
    return env


def test_apply_sizes_the_pool_and_keeps_the_callers_own():
    env = {}
    assert f"at least {cpu_pool.MIN_THREADS}" in cpu_pool.apply(env)
    assert env == {cpu_pool.ENV: str(cpu_pool.threads())}
    assert cpu_pool.threads(2) == cpu_pool.threads(1) == cpu_pool.MIN_THREADS
    assert cpu_pool.threads(16) == 16               # never fewer than one per core
    own = {cpu_pool.ENV: "3"}
    assert "from the environment" in cpu_pool.apply(own) and own == {cpu_pool.ENV: "3"}


@pytest.mark.skipif(cpu_pool.pool_threads() is None, reason="threads are read from Linux /proc")
def test_this_suite_process_runs_the_suites_pool():
    """The pytest process (the plugin applied cpu_pool before its first
    computation; under xdist, the worker) runs the pool it set."""
    import jax.numpy as jnp
    jnp.zeros(1).block_until_ready()
    assert cpu_pool.pool_threads() == int(os.environ[cpu_pool.ENV]) >= cpu_pool.MIN_THREADS


def test_concurrent_batched_solves_finish_in_a_suite_process():
    """1,000 runs of the program on the suite's pool."""
    proc = subprocess.run([sys.executable, "-c", _SOLVES, "1000"], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"pool threads {cpu_pool.threads()}" in proc.stdout


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
    pool threads the program stops within its first runs in most processes;
    three processes, one must hang."""
    env = _env(**{cpu_pool.ENV: "2"})
    assert any(_hangs(env) for _ in range(3))


# gdb's lines for one pool thread of a process hung so (jaxlib 0.10.2).
_POOL_THREAD_WAITING = """Thread 7 (Thread 0x7f (LWP 12) "tf_XLAEigen"):
#0  0x00007f in syscall () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f in absl::synchronization_internal::FutexWaiter::WaitUntil(...)
#4  0x00007f in absl::BlockingCounter::Wait() ()
#5  0x00007f in void jax::ParallelBatchMap<...>(xla::ffi::ThreadPool, long, long, ...)
#6  0x00007f in jax::TriMatrixEquationSolver<(xla::ffi::DataType)11>::Kernel(...)"""
_IDLE_THREAD = """Thread 8 (Thread 0x7e (LWP 13) "tf_XLAEigen"):
#0  0x00007f in syscall () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f in Eigen::ThreadPoolTempl<tsl::thread::EigenEnvironment>::WaitForWork(...)"""


def test_a_hang_in_that_wait_is_named_from_the_native_stacks(monkeypatch):
    monkeypatch.setenv(cpu_pool.ENV, "4")
    stacks = "Native stacks (gdb):\n" + _IDLE_THREAD + "\n" + _POOL_THREAD_WAITING + "\n"
    cause = watchdog.known_wait(stacks)
    assert cause and "batched LAPACK" in cause and f"{cpu_pool.ENV}=4" in cause
    assert watchdog.known_wait("Native stacks (gdb):\n" + _IDLE_THREAD) is None
    # the frames must be one thread's: a wait elsewhere is not this one
    split = _POOL_THREAD_WAITING.replace("#5", "Thread 9:\n#5")
    assert watchdog.known_wait(split) is None
