"""python3 gate/busy_core.py [SECONDS]: hold one core busy with a single
thread that stops by itself after SECONDS (default 7200): the load under
which gate/ci-under-load.sh runs the gate (docs/kernel-authors.md, "What a
verdict may not depend on")."""

import sys
import time


def spin(seconds: float) -> int:
    """Busy-wait on one thread for `seconds`; the loop count."""
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
    return count


if __name__ == "__main__":
    spin(float(sys.argv[1]) if len(sys.argv) > 1 else 7200.0)
