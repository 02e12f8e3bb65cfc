"""Killers independent of the compile settings (issue 50, point 1).

The suite compiles with fast XLA:CPU settings (verification/engine/
compile_settings.py): the same programs, their float operations in another
order. A kill must not depend on that order. The mutation run of a few
mutants, in fresh processes (`gdn-verify mutants --only ...`, the kill
profile's examples), under the suite's settings and under XLA's defaults
(GDN_XLA_DEFAULTS=1): for each mutant and impl the same killing property at
the same example index, the same properties killing it; and no kill on a
knife-edge, under either setting: every killing example's worst ratio of
error to bound is at least KILL_MARGIN, so a reordering of float32 rounding
(the two builds' gradients differ by under half the policy's float32 floor)
cannot turn a kill into a pass. A mutant whose kill was marginal got a
clearer killing example (verification/properties/parity.py,
MIXER_THREE_CHUNKS_T53), not a looser margin.

The mutants: the two whose drawn kills were marginal (5.0 and 4.7 times the
bound), and one each of the gate and the QK norm backward, killed through a
ratio of 1e5 or more."""

import json
import math
import os
import subprocess
import sys

import pytest

from ..plugin import long_running

pytestmark = long_running

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARED = ("state_in_bf16", "pallas_bwd_reads_chunks_forward", "gate_bwd_sigmoid_sign")
KILL_MARGIN = 10.0
SETTINGS = {"suite": {}, "xla_defaults": {"GDN_XLA_DEFAULTS": "1"}}


def _mutation_run(tmp_path, setting: str) -> dict:
    """The mutation report of COMPARED under one compile setting, run in a
    fresh process over an empty compile cache (nothing compiled under the
    other setting can be read; mutant sessions never write one)."""
    out = tmp_path / setting
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GDN_", "JAX_COMPILATION", "PYTEST_")) and k != "XLA_FLAGS"}
    env.update(SETTINGS[setting], JAX_COMPILATION_CACHE_DIR=str(out / "empty-cache"))
    proc = subprocess.run([sys.executable, "-m", "verification.cli", "mutants", "--only",
                           *COMPARED, "--report-dir", str(out), "--jobs", "1"],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "mutation-report.json") as f:
        return json.load(f)


def _worst_ratio(path: str) -> float:
    """The killing example's worst ratio (inf: non-finite, or raised)."""
    with open(path) as f:
        record = json.load(f)
    ratios = [row["ratio"] for row in record.get("error_table") or []]
    return max(ratios) if ratios else math.inf


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kill_settings")
    return {setting: _mutation_run(tmp, setting) for setting in SETTINGS}


def _kills(report: dict) -> dict:
    return {(m["mutant"], m["impl"]): m for m in report["mutants"]}


def test_the_same_killer_at_the_same_example_under_both_settings(reports):
    suite, defaults = (_kills(reports[s]) for s in SETTINGS)
    assert set(suite) == set(defaults) and {m for m, _ in suite} == set(COMPARED)
    for key, record in suite.items():
        other = defaults[key]
        assert record["killed"] and other["killed"], key
        assert (record["killed_by"], record["examples_to_kill"]) == \
            (other["killed_by"], other["examples_to_kill"]), key
        assert record["kills"] == other["kills"], key


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_no_kill_on_a_knife_edge(reports, setting):
    for (mutant, impl), record in _kills(reports[setting]).items():
        for prop, path in record["killing_examples"].items():
            assert path, (mutant, impl, prop)
            ratio = _worst_ratio(path)
            assert ratio >= KILL_MARGIN, (
                f"{mutant}:{impl} killed by {prop} at {ratio:.2f} x the bound under "
                f"{setting}: give it a clearer killing example")
