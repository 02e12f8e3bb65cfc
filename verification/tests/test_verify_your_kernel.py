"""docs/verify-your-kernel.md, run as a kernel author runs it: a fresh
virtual environment in a directory outside this repository, the three
fixture kernels in other conventions (verification/fixture_kernels/convention_fixtures,
written independently of gdn_kernels) wrapped by the doc's adapter modules,
every property run on each (no false alarm), each fixture's planted bug
failing with a counterexample that replays (and holds once fixed), and the
gate script on a fixture repository: green, then red with the planted bug.
Every command of the doc is run here, in its order."""

import fcntl
import importlib
import json
import os
import re
import shutil

import pytest
import yaml

from ..plugin import long_running
from .test_kernel_author import INSTALL, ROOT, Author, doc_commands, installed_author

pytestmark = long_running        # whole suite runs in subprocesses
DOC = "docs/verify-your-kernel.md"
FIXTURES = os.path.join(ROOT, "verification", "fixture_kernels", "convention_fixtures")
KERNELS = ("head_first", "varlen", "norm_inside")       # fixture module = kernel file name
LAYER_FIXTURES = os.path.join(ROOT, "verification", "fixture_kernels", "layer_fixtures")
LAYERS = ("separate_convs", "grouped_chunked")           # whole layers (adapt_mixer)
TORCH_TARGET = "fla_chunk_target"                       # the doc's torch example (section 7)
MLX_TARGET = "mlx_scan_target"                          # and its MLX one
# What the doc says the suite finds on fla-core's reference chunk op.
FLA_FINDINGS = {"conventions_match_contract", "mixer_gradient_parity",
                "near_zero_rows_vjp_parity", "mixer_split_invariance"}


def _block(name):
    return doc_commands(DOC, f"<!-- {name} -->", f"<!-- /{name} -->")


def doc_files():
    """{file name: text} of the doc's python blocks marked <!-- file: NAME -->."""
    with open(os.path.join(ROOT, DOC)) as f:
        text = f.read()
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- file: (\S+) -->\s*```python\n(.*?)```", text, re.S)}


def planted_bug(kernel: str):
    return importlib.import_module(f"verification.fixture_kernels.convention_fixtures.{kernel}").PLANTED_BUG


def _plant(path, bug) -> str:
    """Plant bug (old, new) in the file at path; returns the file's text."""
    old, new = bug
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    return text


@pytest.fixture(scope="module")
def author(tmp_path_factory):
    home = tmp_path_factory.mktemp("kernel_author")
    assert not str(home).startswith(ROOT)
    for kernel in KERNELS:
        shutil.copy(os.path.join(FIXTURES, f"{kernel}.py"), home / f"{kernel}.py")
    for layer in LAYERS:
        shutil.copy(os.path.join(LAYER_FIXTURES, f"{layer}.py"), home / f"{layer}.py")
    for name, text in doc_files().items():
        (home / name).write_text(text)
    assert _block("verify-install") == INSTALL        # the same two lines, run once
    return installed_author(home, tmp_path_factory)


def test_the_doc_wraps_each_fixture_in_at_most_15_lines():
    files = doc_files()
    assert sorted(files) == sorted([f"{k}_target.py" for k in KERNELS + LAYERS]
                                   + [f"{TORCH_TARGET}.py", f"{MLX_TARGET}.py"])
    for name, text in files.items():
        code = [line for line in text.splitlines() if line.strip()]
        assert len(code) <= 15, (name, len(code))


def test_every_fixture_passes_every_property_through_its_adapter(author):
    for command, kernel in zip(_block("verify-run"), KERNELS):
        proc = author.run(command)
        assert proc.returncode == 0, proc.output[-4000:]
        summary = proc.output.split("gdn-verify summary", 1)[1]
        assert f"target {kernel}_target " in summary and "FAILED: 0" in summary
        assert "adapter: mixer: reference layer + your core" in summary
        assert "[reference layer + your core]" in summary
        held = int(re.search(r"held on the target: (\d+) properties", summary).group(1))
        assert held >= 15, summary[-3000:]


def test_every_layer_fixture_holds_every_checkable_property(author):
    """The doc's layer runs: each fixture's own custom VJP judged whole
    through adapt_mixer, no false alarm (its planted bugs:
    verification/tests/test_layer_adapter.py)."""
    for command, layer in zip(_block("verify-layer-run"), LAYERS):
        proc = author.run(command)
        assert proc.returncode == 0, proc.output[-4000:]
        summary = proc.output.split("gdn-verify summary", 1)[1]
        assert f"target {layer}_target " in summary and "FAILED: 0" in summary
        assert "adapter: layer: your layer, whole (verification.adapt_mixer)" in summary
        assert "reference layer + your core" not in summary
        for prop in ("mixer_forward_parity", "mixer_gradient_parity",
                     "near_zero_rows_vjp_parity", "cotangent_shapes_and_dtypes",
                     "param_gradient_is_broadcast_sum", "vjp_matches_finite_differences",
                     "state_gradient_parity", "prompt_then_decode"):
            assert re.search(rf"^{prop}\s+held", summary, re.M), (prop, summary[-3000:])
        assert re.search(r"^delta_rule_forward_parity\s+not checkable .*a layer-only target",
                         summary, re.M), summary[-3000:]
        held = int(re.search(r"held on the target: (\d+) properties", summary).group(1))
        assert held >= 14, summary[-3000:]


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_planted_bug_fails_with_a_counterexample_that_replays(author, kernel):
    """The doc's failure section for head_first; the same commands on the
    other two fixtures, their run stopped at its first failing property
    (pytest's -x: what is checked there is that the fixture's bug is found
    through its adapter and replays; head_first's run is the doc's whole
    one, every failing property shrunk)."""
    run, replay, replay_fixed = [c.replace("head_first_target", f"{kernel}_target")
                                 for c in _block("verify-failure")]
    if kernel != "head_first":
        run += " -- -x"
    path, bug = os.path.join(author.home, f"{kernel}.py"), planted_bug(kernel)
    shutil.rmtree(os.path.join(author.home, "counterexamples"), ignore_errors=True)
    clean = _plant(path, bug)
    try:
        failing = author.run(run)
        assert failing.returncode == 1, failing.output[-3000:]
        assert re.search(r"FAILED: [1-9]", failing.output)
        files = os.listdir(os.path.join(author.home, "counterexamples"))
        assert files, failing.output[-2000:]
        still = author.run(replay)
        assert still.returncode == 1 and "FAIL" in still.output, still.output[-2000:]
    finally:
        with open(path, "w") as f:
            f.write(clean)
    fixed = author.run(replay_fixed)
    assert fixed.returncode == 0, fixed.output[-2000:]


GATE_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "my-kernels"
version = "0.0.1"

[tool.setuptools]
packages = ["my_kernels"]
"""


def test_the_gate_script_on_a_fixture_repository(author, tmp_path):
    """A repository with one kernel package (head_first, the doc's adapter
    as my_kernels/gdn_target.py), gated by the doc's command as that
    repository runs it: green, then red with the planted bug."""
    repo = tmp_path / "my_repo"
    (repo / "my_kernels").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(GATE_PYPROJECT)
    (repo / "my_kernels" / "__init__.py").write_text("")
    shutil.copy(os.path.join(FIXTURES, "head_first.py"), repo / "my_kernels" / "head_first.py")
    target = doc_files()["head_first_target.py"].replace(
        "from head_first import", "from my_kernels.head_first import")
    (repo / "my_kernels" / "gdn_target.py").write_text(target)
    (command,) = _block("verify-gate")
    # the author's environment (installed above) and a short run
    command += (f" --venv {author.home}/venv --examples 2 -- --properties "
                f"delta_rule_forward_parity,delta_rule_gradient_parity,mixer_gradient_parity")
    gate = Author(repo)
    gate.env["PATH"] = author.env["PATH"]
    gate.env["XDG_CACHE_HOME"] = author.env["XDG_CACHE_HOME"]
    summary = tmp_path / "step-summary.md"           # as GitHub Actions provides it
    gate.env["GITHUB_STEP_SUMMARY"] = str(summary)

    def run():
        return gate.run(command, activate=False)     # the script makes its own environment

    green = run()
    assert green.returncode == 0, green.output[-4000:]
    text = summary.read_text()
    assert "## gdn-verify: `my_kernels.gdn_target`" in text and "exit 0" in text, text
    assert "| delta_rule_forward_parity | held |" in text and "\nPASS: 1 shard(s)" in text, text
    report = json.loads((repo / "gdn-verify-report" / "gdn-verify.json").read_text())
    assert report["target"] == "my_kernels.gdn_target"
    assert (repo / "gdn-verify-report" / "gdn-verify.xml").exists()
    _plant(repo / "my_kernels" / "head_first.py", planted_bug("head_first"))
    red = run()
    assert red.returncode == 1, red.output[-4000:]
    text = summary.read_text().split("## gdn-verify:")[-1]
    assert "exit 1" in text and "| FAILED |" in text and "\nFAIL: 1 shard(s)" in text, text
    assert os.listdir(repo / "gdn-verify-report" / "counterexamples")


def _workflow(name):
    with open(os.path.join(ROOT, ".github", "workflows", name)) as f:
        return yaml.safe_load(f)


def test_the_reusable_workflow_parses_and_runs_the_gate_script():
    wf = _workflow("gate.yml")
    inputs = wf[True]["workflow_call"]["inputs"]           # YAML reads `on` as True
    for name in ("target", "profile", "known-failures", "requirements", "python-version",
                 "suite-repository", "suite-ref"):
        assert name in inputs
    steps = wf["jobs"]["gate"]["steps"]
    assert any("gate/gdn-verify-gate.sh" in s.get("run", "") for s in steps)
    with open(os.path.join(ROOT, DOC)) as f:
        caller = yaml.safe_load(f.read().split("```yaml\n", 1)[1].split("```", 1)[0])
    job = caller["jobs"]["gdn-verify"]
    assert job["uses"].endswith(".github/workflows/gate.yml@main")
    assert set(job["with"]) <= set(inputs)
    assert {n for n, i in inputs.items() if i.get("required")} <= set(job["with"])


def test_ci_and_the_workflow_draw_the_same_examples(monkeypatch):
    """The ci profile is derandomized with or without the workflow's shared
    database; .ci/run and the workflow's push runs both use it."""
    from hypothesis import settings

    from ..engine.profiles import register_profiles
    monkeypatch.setenv("GDN_HYPOTHESIS_DB", "/tmp/gdn-shared-db")
    try:
        register_profiles()
        ci = settings.get_profile("ci")
    finally:
        monkeypatch.delenv("GDN_HYPOTHESIS_DB")
        register_profiles()
    assert ci.derandomize and ci.database is None
    env = _workflow("verify.yml")["jobs"]["verify"]["env"]
    assert "'ci'" in env["GDN_PROFILE"] and "schedule" in env["GDN_PROFILE"]
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert "GDN_PROFILE=ci python -m pytest" in f.read()


def _authors_torch() -> str:
    """The torch the author is taken to have: the release .ci/run installs
    (its CPU build; a bare `torch` from the index is a CUDA build)."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        return re.search(r'"(torch==[^"]+)"', f.read()).group(1)


def _install_once(author, name: str, commands) -> None:
    """Run these install commands in the author's shared environment once
    per test session (the marker `name` beside it), under its lock."""
    shared = os.path.dirname(os.path.realpath(os.path.join(author.home, "venv")))
    with open(os.path.join(shared, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = os.path.join(shared, name)
        if not os.path.exists(marker):
            for command in commands:
                proc = author.run(command)
                assert proc.returncode == 0, proc.output[-3000:]
            with open(marker, "w") as f:
                f.write("installed")


def test_a_torch_op_of_the_field_verified_as_it_is(author):
    """The doc's torch section: fla's reference chunk op wrapped by
    from_torch and adapt in the doc's file, run from the author's
    directory: the findings the doc names fail (and only they), the
    properties it cannot carry say why, the rest hold. The author's torch
    and the doc's install are added to the shared environment once."""
    _install_once(author, "torch-installed",
                  [f'pip install "{_authors_torch()}"'] + _block("verify-torch-install"))
    (command,) = _block("verify-torch-run")
    proc = author.run(command)
    assert proc.returncode == 1, proc.output[-4000:]
    summary = proc.output.split("gdn-verify summary", 1)[1]
    assert "adapter: torch kernel through from_torch (on cpu" in summary, summary[-3000:]
    with open(os.path.join(author.home, "fla-report.json")) as f:
        verdicts = {n: p for n, p in json.load(f)["properties"].items()}
    failed = {n for n, p in verdicts.items() if p["verdict"] == "FAILED"}
    assert failed == FLA_FINDINGS, summary[-4000:]
    assert any("o dtype" in c for c in verdicts["conventions_match_contract"]["classes"])
    assert any("da_log" in c for c in verdicts["mixer_gradient_parity"]["classes"])
    assert "from_torch" in " ".join(verdicts["decode_compiles_once"]["reasons"])
    held = [n for n, p in verdicts.items() if p["verdict"] == "held"]
    assert len(held) >= 15, summary[-3000:]     # GVA equivalence: the adapter's repeat


def test_an_mlx_kernel_holds_every_checkable_property(author):
    """The doc's MLX example, from the author's directory: green, every
    property it can carry held, compile counts not checkable by name."""
    _install_once(author, "mlx-installed", _block("verify-mlx-install"))
    (command,) = _block("verify-mlx-run")
    proc = author.run(command)
    assert proc.returncode == 0, proc.output[-4000:]
    summary = proc.output.split("gdn-verify summary", 1)[1]
    assert "adapter: mlx kernel through from_mlx" in summary and "FAILED: 0" in summary
    held = int(re.search(r"held on the target: (\d+) properties", summary).group(1))
    assert held >= 18, summary[-3000:]          # GVA equivalence: the adapter's repeat
    assert re.search(r"^decode_compiles_once\s+not checkable .*from_mlx", summary, re.M)
