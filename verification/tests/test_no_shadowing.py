"""gdn-verify in a kernel author's project that has its own packages named
like the suite's (verification, strategies, benchmarks): installed, it
leaves the project's own tests untouched under `pytest` and `python -m
pytest` (its entry point imports nothing of the suite until a target is
named), and with --gdn-target the suite runs there on its own packages,
its mesh worker included (gdn_verify.load_suite, gdn_verify.run)."""

import os
import subprocess
import sys

import pytest

from gdn_verify import suite_root

PYTEST_SCRIPT = os.path.join(os.path.dirname(sys.executable), "pytest")

# The author's project: packages named like the suite's, and a test of its own.
PROJECT = {
    "pytest.ini": "[pytest]\npythonpath = .\n",        # the project's packages importable
    "verification/__init__.py": "",
    "verification/core.py": "ok = 'the project verification package'\n",
    "strategies/__init__.py": "mine = 'the project strategies package'\n",
    "benchmarks/__init__.py": "",
    "benchmarks/speed.py": "fast = True\n",
    "tests/test_own.py": (
        "from verification.core import ok\n"
        "from strategies import mine\n"
        "from benchmarks.speed import fast\n\n"
        "def test_my_own_packages():\n"
        "    assert ok.startswith('the project') and mine.startswith('the project') and fast\n"),
}


@pytest.fixture
def project(tmp_path):
    for path, text in PROJECT.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return tmp_path


def _run(project, *command):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GDN_", "PYTEST_")) and k != "CI"}
    return subprocess.run([*command, "-p", "no:cacheprovider"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("how", ("pytest", "python -m pytest"))
def test_the_projects_own_tests_run_untouched(project, how):
    command = [PYTEST_SCRIPT] if how == "pytest" else [sys.executable, "-m", "pytest"]
    proc = _run(project, *command)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]
    assert "gdn-verify:" not in proc.stdout           # the suite never activated


@pytest.mark.parametrize("how", ("pytest", "python -m pytest"))
def test_the_suite_runs_there_with_a_target(project, how):
    command = [PYTEST_SCRIPT] if how == "pytest" else [sys.executable, "-m", "pytest"]
    proc = _run(project, *command, "--gdn-target", "gdn_kernels:xla", "--gdn-properties",
                "determinism,sharded_mixer_equals_one_device", "--gdn-examples", "1")
    out = proc.stdout
    assert proc.returncode == 0 and "2 passed" in out, out[-3000:] + proc.stderr[-2000:]
    assert "held on the target: 2 properties" in out, out[-3000:]


def test_a_project_package_imported_first_is_named_with_what_to_do(project):
    """Where the collision cannot be avoided (the project's conftest imported
    its own `strategies` before the suite loaded), the usage error names it."""
    (project / "conftest.py").write_text("import strategies  # the project's own\n")
    proc = _run(project, sys.executable, "-m", "pytest", "--gdn-target", "gdn_kernels:xla",
                "--gdn-properties", "determinism")
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr + proc.stdout
    assert "strategies (" in err and "were imported before gdn-verify could load" in err, err
    assert "gdn-verify --target" in err


def test_the_public_api_under_gdn_verifys_own_name(project):
    """`from gdn_verify import ...` is the documented alias of `from
    verification import ...`: in the project's directory it is the suite's."""
    code = ("from gdn_verify import KernelDeclaration, Limits, Supports, adapt, "
            "mixer_from_core\n"
            "import verification\n"
            "print(verification.__file__)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == os.path.join(suite_root(), "verification", "__init__.py"), \
        proc.stdout
