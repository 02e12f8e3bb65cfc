"""A watchdog for an example that never ends: the process made no progress
(the example has run for the bound) and it sat idle, its child processes
too (under IDLE_CPU of a core over the bound: process_cpu_s), as when a kernel waits on something
that never comes: a host callback's event, a collective, a thread pool
whose threads all wait (jaxlib's batched LAPACK calls filling XLA:CPU's
intra-op pool: cpu_pool.py; `known_wait` names that one from the native
stacks).

A busy process (a long compile, a slow interpreted kernel) is never
called hung, however long it takes: only a wait is.

The bound is GDN_HANG_AFTER_S seconds (default DEFAULT_AFTER_S; 0 turns
the watchdog off), the --gdn-hang-after option of the plugin and
gdn-verify. When it fires, its thread calls the watch's handler (which
records the example as failure class HUNG, with the stacks of every
thread: `stacks_text`) and then ends the process with HUNG_EXIT: the
waiting thread cannot be interrupted. Under pytest-xdist the controller
replaces the worker and the run goes on (plugin.Recording adopts the
worker's record of the hang); `gdn-verify replay` ends with its verdict.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Callable, Optional, Tuple

HUNG = "hung"                     # the failure class of an example that never ended
AFTER_ENV = "GDN_HANG_AFTER_S"
DEFAULT_AFTER_S = 300.0
IDLE_CPU = 0.05                   # CPU seconds per second of wall: "idle"
HUNG_EXIT = 1                     # the exit status of a process the watchdog ended (a failure)
# where xdist workers leave their records of a hang for the controller
RECORDS_ENV = "GDN_HANG_RECORDS"


def after_s(environ=os.environ) -> float:
    """The bound in seconds (0: off)."""
    value = environ.get(AFTER_ENV, "")
    try:
        bound = float(value) if value else DEFAULT_AFTER_S
    except ValueError:
        raise ValueError(f"{AFTER_ENV} must be a number of seconds, got {value!r}") from None
    if bound < 0:
        raise ValueError(f"{AFTER_ENV} must be >= 0, got {value!r}")
    return bound


def python_stacks() -> str:
    """The Python stack of every thread of this process (faulthandler)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def native_stacks(timeout_s: float = 30.0) -> str:
    """The native stack of every thread (gdb attached to this process),
    or why it cannot be read here. gdb writes to a file, never a pipe:
    while attached it stops every thread of this process, the reader's
    too, and a full pipe would stop gdb in turn."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(native stacks not read: gdb is not installed)"
    with tempfile.TemporaryFile("w+") as out:
        try:
            subprocess.run([gdb, "-p", str(os.getpid()), "-batch", "-nx",
                            "-ex", "thread apply all bt 30"], stdin=subprocess.DEVNULL,
                           stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"(native stacks not read: {err})"
        out.seek(0)
        text = out.read()
    lines = [ln for ln in text.splitlines() if ln.startswith(("Thread ", "#"))]
    return "\n".join(lines) if lines else f"(native stacks not read: {text.strip()[-300:]})"


def stacks_text() -> str:
    return ("Python stacks (faulthandler):\n" + python_stacks()
            + "\nNative stacks (gdb):\n" + native_stacks() + "\n")


# Waits whose cause the native stacks name: (frames that all appear in a
# stuck thread's stack, what the wait is).
KNOWN_WAITS = (
    (("ParallelBatchMap", "BlockingCounter::Wait"),
     "XLA:CPU's intra-op pool threads wait inside jaxlib's batched LAPACK kernel "
     "(jax::ParallelBatchMap): the program ran as many batched solves at once as the pool "
     "has threads ({ENV}={threads}), each waiting for pieces of its batch no free thread "
     "is left to run (verification/engine/cpu_pool.py)"),
)


def stacks_and_cause() -> Tuple[str, Optional[str]]:
    """The stacks of every thread (stacks_text) and the wait they show, where
    KNOWN_WAITS names it (known_wait), or None."""
    stacks = stacks_text()
    return stacks, known_wait(stacks)


def known_wait(stacks: str) -> Optional[str]:
    """What a hang is, where the native stacks show a wait KNOWN_WAITS names
    (a thread's stack holding every frame of one), or None."""
    from .cpu_pool import ENV
    threads = stacks.split("\nThread ")
    for frames, cause in KNOWN_WAITS:
        if any(all(frame in thread for frame in frames) for thread in threads):
            return cause.format(ENV=ENV, threads=os.environ.get(ENV, "one per core"))
    return None


def process_cpu_s() -> float:
    """CPU seconds of this process and of its child processes that run now
    (a mesh worker compiling for the example is progress too; Linux /proc,
    elsewhere this process alone)."""
    total = time.process_time()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return total
    tick = os.sysconf("SC_CLK_TCK")
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for pid in children:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
    return total


class Watchdog:
    """One thread per process, watching the example that runs now."""

    def __init__(self, bound_s: float, clock=time.monotonic, cpu=process_cpu_s,
                 poll_s: Optional[float] = None):
        self.bound_s, self.clock, self.cpu = bound_s, clock, cpu
        self.poll_s = poll_s or min(5.0, max(0.2, bound_s / 10))
        self._lock = threading.Lock()
        self._watch = None            # (handler, started) of the example running now
        self._thread = None

    @contextlib.contextmanager
    def watching(self, on_hang: Callable[[float], None]):
        """Watch the block: on a hang, on_hang(stalled seconds) runs in the
        watchdog's thread, then the process ends (HUNG_EXIT)."""
        if self.bound_s <= 0:
            yield
            return
        self._start()
        with self._lock:
            outer, self._watch = self._watch, (on_hang, self.clock())
        try:
            yield
        finally:
            with self._lock:
                self._watch = outer

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gdn-watchdog", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        last_busy, cpu_then = self.clock(), self.cpu()
        while True:
            time.sleep(self.poll_s)
            now, cpu_now = self.clock(), self.cpu()
            if cpu_now - cpu_then > IDLE_CPU * self.poll_s:
                last_busy = now
            cpu_then = cpu_now
            with self._lock:
                watch = self._watch
            if watch is None:
                continue
            on_hang, started = watch
            stalled = now - max(started, last_busy)
            if stalled >= self.bound_s:
                try:
                    on_hang(stalled)
                except BaseException as err:        # noqa: BLE001 -- the process ends anyway
                    os.write(2, f"gdn-verify watchdog: recording the hang failed: "
                                f"{err!r}\n".encode())
                finally:
                    os._exit(HUNG_EXIT)


_INSTANCE = []


def instance() -> Watchdog:
    """This process's watchdog (its bound read from the environment once)."""
    if not _INSTANCE:
        _INSTANCE.append(Watchdog(after_s()))
    return _INSTANCE[0]
