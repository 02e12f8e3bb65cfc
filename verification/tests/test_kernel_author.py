"""A kernel author's first run, as docs/kernel-authors.md "Verify your own
kernel" tells it: a fresh virtual environment in an empty directory outside
this repository, the project installed into it, the author's float32 scan
(verification/fixture_kernels/author_fixture/my_kernels.py) verified with `pytest
--gdn-target` and `gdn-verify --target`, the author's own tests untouched
by the plugin, a planted bug failing with a counterexample that replays,
and bad target specs rejected as usage errors. Every command of that doc
section (and of the README's) is run here, in the order a user runs them.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

from ..cli import AUTO_JOBS_ENV
from ..plugin import long_running
from ..properties import load_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "verification", "fixture_kernels", "author_fixture", "my_kernels.py")
REPO_PLACEHOLDER = "/path/to/gdn-verify"
# Examples per property for the scenario's runs (GDN_EXAMPLES): every
# property runs; the example budget is the profiles' business.
EXAMPLES = "2"

OWN_TEST = '''
import os
from hypothesis import settings

def test_my_own_code_sees_my_environment():
    assert os.environ.get("XLA_FLAGS") == "--xla_cpu_enable_fast_math=false"
    assert "GDN_TARGET" not in os.environ
    assert settings.get_current_profile_name() == "default"
'''

PLANTED_BUG = ("err = v_t - jnp.einsum", "err = 1.5 * v_t - jnp.einsum")


def doc_commands(path: str, begin: str, end: str):
    """The command lines (comments dropped) of the fenced block between the
    markers in a doc."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    block = text.split(begin, 1)[1].split(end, 1)[0]
    lines = block.split("```bash", 1)[1].split("```", 1)[0].splitlines()
    return [re.sub(r"\s+#.*$", "", line).strip() for line in lines
            if line.strip() and not line.strip().startswith("#")]


DOC = doc_commands("docs/kernel-authors.md", "<!-- kernel-author-commands -->",
                   "<!-- /kernel-author-commands -->")
README = doc_commands("README.md", "<!-- kernel-author-commands -->",
                      "<!-- /kernel-author-commands -->")


class Author:
    """The author's directory and virtual environment; run() runs one doc
    command line there (the venv active, as after its first line)."""

    def __init__(self, home):
        self.home = str(home)
        self.ran = []
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("GDN_", "PYTEST_", "JAX_COMPILATION"))}
        # one worker per gdn-verify run: this test already runs beside the
        # suite's other tests on every core (xdist's own knob for -n auto)
        self.env.update(XLA_FLAGS="--xla_cpu_enable_fast_math=false", GDN_EXAMPLES=EXAMPLES,
                        PYTHONDONTWRITEBYTECODE="1", **{AUTO_JOBS_ENV: "1"})
        # one Hypothesis seed for every run of the doc's commands: a planted
        # bug's run shrinks each failure class it meets, so an unseeded dev
        # run took 21 s or 131 s by the luck of its draw (the gate's time)
        self.env["PYTEST_ADDOPTS"] = "--hypothesis-seed=0"
        self.env.pop("VIRTUAL_ENV", None)
        self.env.pop("CI", None)        # Hypothesis loads its own "ci" profile where CI is set
        self.env["PATH"] = os.pathsep.join(
            p for p in self.env.get("PATH", "").split(os.pathsep)
            if not p.startswith(os.path.dirname(sys.executable)))

    def run(self, command: str, timeout=900, activate=True):
        self.ran.append(command)
        line = command.replace(REPO_PLACEHOLDER, ROOT)
        if activate and not line.startswith("python3 -m venv"):
            line = ". venv/bin/activate && " + line
        proc = subprocess.run(["bash", "-c", line], cwd=self.home, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        proc.output = proc.stdout + proc.stderr
        return proc


INSTALL = DOC[:2]                               # the venv, the install


def installed_author(home, tmp_path_factory) -> Author:
    """An Author in `home` whose `venv` is the doc's install (INSTALL, the
    same two lines in docs/verify-your-kernel.md), run once per test session
    in a shared folder (under a file lock: the xdist workers share it) and
    linked into home; each author records those lines as run."""
    import fcntl
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "author-venv"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "installed").exists():
            builder = Author(shared)
            for command in INSTALL:
                proc = builder.run(command)
                assert proc.returncode == 0, proc.output[-3000:]
            (shared / "installed").write_text("\n".join(INSTALL))
    os.symlink(shared / "venv", os.path.join(str(home), "venv"))
    me = Author(home)
    # the user cache directory (the compile cache's default) of this test
    # session, shared by its authors: never a warm one left by earlier runs
    me.env["XDG_CACHE_HOME"] = str(shared / "user-cache")
    me.ran += INSTALL
    return me


@pytest.fixture(scope="module")
def author(tmp_path_factory):
    home = tmp_path_factory.mktemp("author")
    assert not str(home).startswith(ROOT)
    shutil.copy(FIXTURE, home / "my_kernels.py")
    (home / "test_own.py").write_text(OWN_TEST)
    return installed_author(home, tmp_path_factory)


def _summary(output: str) -> str:
    return output.split("gdn-verify summary", 1)[1]


@long_running
def test_the_scenario_of_the_docs(author):
    pytest_run = author.run("pytest --gdn-target my_kernels")
    assert pytest_run.returncode == 0, pytest_run.output[-4000:]
    out = pytest_run.output
    # only the properties ran: one test each (test_properties.py), none of ours
    counts = re.search(r"(\d+) passed, (\d+) skipped", out)
    assert counts and sum(map(int, counts.groups())) == len(load_all()), out[-2000:]
    assert "target my_kernels (profile dev, scope properties)" in out
    assert "FAILED: 0" in _summary(out)
    # not checkable, never passed: no packed rows, carried state, validation, sharding
    assert re.search(r"not checkable: 16 properties .*segment_ids_are_data", out)
    assert "gdn-verify: delta_rule_gradient_parity: held:" in out        # progress lines

    cli = author.run("gdn-verify --target my_kernels")
    assert cli.returncode == 0, cli.output[-3000:]
    assert "target my_kernels (profile dev, scope properties)" in cli.output

    listing = author.run("gdn-verify list")
    assert listing.returncode == 0 and f"properties ({len(load_all())})" in listing.output
    assert re.search(r"l2norm_scale_invariance\s+eps\s+needs: l2norm_hooks", listing.output)

    own = author.run("pytest")
    assert own.returncode == 0, own.output[-3000:]
    assert "1 passed" in own.output and "plugins: gdn-verify" in own.output
    assert "gdn-verify:" not in own.output and "summary" not in own.output

    # a planted bug: the run fails, writes a counterexample, which replays
    source = (author.home + "/my_kernels.py")
    good = open(source).read()
    assert PLANTED_BUG[0] in good
    with open(source, "w") as f:
        f.write(good.replace(*PLANTED_BUG))
    broken = author.run("gdn-verify --target my_kernels --properties "
                        "delta_rule_forward_parity,mixer_forward_parity")
    assert broken.returncode == 1, broken.output[-3000:]
    assert re.search(r"FAILED: 2 \(delta_rule_forward_parity, mixer_forward_parity\)",
                     broken.output)
    files = sorted(os.listdir(os.path.join(author.home, "counterexamples")))
    assert files, broken.output[-2000:]
    again = author.run("gdn-verify replay counterexamples/*.json")
    assert again.returncode == 1 and "STILL FAILS" in again.output, again.output[-2000:]
    with open(source, "w") as f:
        f.write(good)
    fixed = author.run("gdn-verify replay counterexamples/*.json")
    assert fixed.returncode == 0 and "all pass" in fixed.output, fixed.output[-2000:]

    assert set(DOC) <= set(author.ran), set(DOC) - set(author.ran)
    assert set(README) <= set(author.ran), set(README) - set(author.ran)


@pytest.mark.parametrize("command, reason", [
    ("gdn-verify --target no_such_kernels", "cannot import 'no_such_kernels'"),
    ("pytest --gdn-target json", "no callable gated_delta_rule"),
    ("pytest --gdn-target my_kernels@data=2", "does not declare"),
])
def test_a_bad_target_is_a_usage_error_with_one_line(author, command, reason):
    proc = author.run(command, timeout=300)
    assert proc.returncode == 4, proc.output[-2000:]
    errors = [line for line in proc.output.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and reason in errors[0], proc.output[-2000:]
    assert "Traceback" not in proc.output and "INTERNALERROR" not in proc.output
