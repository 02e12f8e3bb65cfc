"""The Hypothesis range of pyproject.toml: the suite installs beside a
kernel author's own Hypothesis, runs on both ends of the range, says in its
header when it is not the gate's release, and the gate still pins that
release through constraints.txt (.ci/run, gate/gdn-verify-gate.sh)."""

import os
import re
import subprocess
import sys
import sysconfig

import pytest

from ..engine.profiles import GATE_HYPOTHESIS
from ..plugin import long_running

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCAN = "verification.fixture_kernels.foreign_targets.float32_only_scan"


def hypothesis_range():
    """(lowest, highest) release of pyproject's test extra."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    test = re.search(r"^test = \[(.*)\]$", text, re.M).group(1)
    return re.search(r'"hypothesis>=([\d.]+),<=([\d.]+)"', test).groups()


def test_the_gate_pins_the_release_its_draws_are_measured_with():
    low, high = hypothesis_range()
    assert high == GATE_HYPOTHESIS and low < high
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        pins = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    assert f"hypothesis=={GATE_HYPOTHESIS}" in pins, pins
    for script in (".ci/run", "gate/gdn-verify-gate.sh"):
        with open(os.path.join(ROOT, script)) as f:
            assert "constraints.txt" in f.read(), script


def _environment_with(tmp_path, version: str) -> str:
    """A virtual environment holding this Hypothesis release, over this
    environment's packages (a .pth adds its site-packages after its own):
    its python."""
    venv = tmp_path / f"hypothesis-{version}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                            "['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    with open(os.path.join(purelib, "zz_gdn_verify_environment.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({ours!r})\n")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                              "--target", purelib, f"hypothesis=={version}"],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    return python


@long_running
@pytest.mark.parametrize("end", ("lowest", "highest"))
def test_the_suite_runs_on_both_ends_of_its_hypothesis_range(end, tmp_path):
    """Each end of the range installed: properties drawn, shrunk and judged
    as usual; the header names a release other than the gate's."""
    version = hypothesis_range()[end == "highest"]
    python = _environment_with(tmp_path, version)
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_PROFILE", "CI")}
    proc = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "--gdn-target", SCAN,
                           "--gdn-properties", "delta_rule_forward_parity,state_gradient_parity",
                           "--gdn-examples", "2"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in out and "FAILED: 0" in out, out[-3000:]
    note = f"Hypothesis {version}: the gate's draws are measured with"
    other = version != GATE_HYPOTHESIS
    assert (f"gdn-verify: {note}" in out) == other, out[:3000]      # the header
    assert (f"\n  {note}" in out) == other, out[-3000:]            # the verdict lines


@pytest.mark.parametrize("moved", ("_local_constants", "CONSTANTS_CACHE"))
def test_a_hypothesis_that_keeps_its_constant_pool_elsewhere_fails_clearly(moved, monkeypatch):
    """freeze_local_constants reaches into Hypothesis's private state (the
    pool of constants read from loaded modules, which made derandomized
    draws depend on the process's history): a release that keeps it
    elsewhere raises, naming what is missing and what to install, rather
    than letting the history dependence back in silently."""
    from hypothesis.internal.conjecture import providers

    from ..engine.profiles import freeze_local_constants
    monkeypatch.delattr(providers, moved)
    with pytest.raises(RuntimeError, match=rf"cannot keep Hypothesis .*{moved}.*install a "
                                           rf"Hypothesis of the range .*{GATE_HYPOTHESIS}"):
        freeze_local_constants()


def test_the_constant_pool_stays_empty_once_frozen():
    """The guard's positive side: frozen, the pool admits no constant of a
    module loaded later (Hypothesis extends it by union)."""
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import Constants

    from ..engine.profiles import freeze_local_constants
    freeze_local_constants()
    pool = providers._local_constants
    grown = pool | Constants(integers={12345}, floats={0.123}, bytes=set(), strings={"x"})
    assert len(pool) == 0 and grown is pool and len(grown) == 0
