"""The watchdog (verification/engine/watchdog.py): an example that waits for
ever ends as failure class hung, with the stacks of every thread, while a
busy one is never called hung; under gdn-verify the other properties keep
their verdicts, and the replay of the hung counterexample ends too."""

import glob
import os
import subprocess
import sys

import pytest

from verification.engine import watchdog

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WATCHED = """
import sys, time
from verification.engine.watchdog import Watchdog
dog = Watchdog(0.5, poll_s=0.1)
with dog.watching(lambda stalled: print(f"hung after {stalled:.1f} s", flush=True)):
    if sys.argv[1] == "idle":
        time.sleep(60)
    else:
        end = time.time() + 3.0
        while time.time() < end:
            pass
print("returned", flush=True)
"""


@pytest.mark.parametrize("work, hung", [("idle", True), ("busy", False)])
def test_an_idle_wait_is_hung_and_a_busy_one_is_not(work, hung):
    proc = subprocess.run([sys.executable, "-c", _WATCHED, work], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    if hung:
        assert proc.returncode == watchdog.HUNG_EXIT
        assert proc.stdout.startswith("hung after") and "returned" not in proc.stdout
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout == "returned\n"


def test_the_bound_is_checked():
    assert watchdog.after_s({}) == watchdog.DEFAULT_AFTER_S
    assert watchdog.after_s({watchdog.AFTER_ENV: "0"}) == 0
    for bad in ("soon", "-1"):
        with pytest.raises(ValueError, match=watchdog.AFTER_ENV):
            watchdog.after_s({watchdog.AFTER_ENV: bad})


def _cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop(watchdog.AFTER_ENV, None)
    return subprocess.run([sys.executable, "-m", "verification.cli"] + args,
                          capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_a_kernel_that_never_returns_is_failed_as_hung_and_the_run_goes_on(tmp_path):
    """blocks_on_returned_state waits for ever in mixer_split_invariance's
    calls only: on 2 workers that property is FAILED [hung] (its worker
    ended and replaced), the stacks beside its counterexample, the others
    hold, the exit status is 1; its replay ends FAILED as well."""
    target = "verification.fixture_kernels.wrong_targets.blocks_on_returned_state"
    run = _cli(["--profile", "dev", "--jobs", "2", "--hang-after", "10", "--target", target,
                "--properties", "mixer_split_invariance,causality,batch_independence"],
               tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert "failure class hung" in out, out[-4000:]          # the summary's row
    assert "no example finished in 1" in out, out[-4000:]
    for other in ("causality", "batch_independence"):
        assert f"{other}: held" in out, out[-4000:]
    [stacks] = glob.glob(str(tmp_path / "counterexamples" / "*.stacks.txt"))
    text = open(stacks).read()
    assert "in _wait_forever" in text           # the Python stack of the waiting thread
    assert "Native stacks (gdb):" in text
    [case] = glob.glob(str(tmp_path / "counterexamples" / "mixer_split_invariance-*.json"))
    replay = _cli(["replay", case, "--hang-after", "10"], tmp_path)
    assert replay.returncode == 1, replay.stdout[-3000:] + replay.stderr[-2000:]
    assert "STILL FAILS: mixer_split_invariance [hung]" in replay.stdout
