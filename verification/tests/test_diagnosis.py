"""The diagnosis of a failing case (verification/engine/diagnosis.py): which
one change makes it pass, and failure classes of one cause reported as one."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from strategies.cases import MixerCase

from ..engine import diagnosis, runners
from ..engine.diagnosis import causes
from ..engine.registry import PROPERTIES, PropertyFailure
from ..properties import load_all

load_all()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IGNORES_SCALE = "verification.fixture_kernels.wrong_targets.ignores_scale"


def _drawn(prop_id, n=12):
    cases = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=PROPERTIES[prop_id].strategy)
    def draw(case):
        cases.append(case)

    draw()
    return cases


def test_the_changes_that_make_a_case_pass_are_named():
    """A check failing only under strong gates at a scale other than the
    default: either change alone makes the case pass; the others do not."""
    (case,) = [c for c in _drawn("delta_rule_gradient_parity", 40)
               if c.scale is not None and c.dtype == "bfloat16"][:1]
    case = dataclasses.replace(case, gate_regime="strong_decay")

    def check(c):
        if c.gate_regime == "strong_decay" and c.scale is not None:
            raise PropertyFailure("p", [])
        return []

    found = diagnosis.diagnose(check, case)
    assert set(found.passes_with) == {"ordinary gates", "the default scale"}
    assert "float32 inputs" in found.fails_with and not found.untried
    assert found.cause.startswith("passes with ordinary gates or the default scale")


def test_what_cannot_be_tried_or_outlasts_the_bound_is_listed():
    case = dataclasses.replace(_drawn("delta_rule_gradient_parity")[0], gate_regime="mixed",
                               beta_regime="zero")

    def check(c):
        if c.beta_regime == "ordinary":
            raise ValueError("the check raised")
        raise PropertyFailure("p", [])

    clock = iter([0, 10, 20] + list(range(40, 1000, 20))).__next__   # two changes in time
    found = diagnosis.diagnose(check, case, budget_s=30.0, clock=clock)
    assert found.fails_with == ("ordinary gates",)
    assert ("ordinary beta (away from 0 and 1)", "raised ValueError") in found.untried
    assert all(why.endswith("s bound") for _, why in found.untried[1:]) and found.untried[1:]
    assert "partial: not tried" in found.cause


def _param(shape, b, t, hv):
    """A parameter shape [Hv], [B', Hv] or [B', T', Hv] that broadcasts
    against [B, T, Hv] (B' in {1, B}, T' in {1, T}); else a shape that
    cannot match."""
    ok = shape[-1] == hv and (len(shape) < 2 or shape[0] in (1, b)) and (
        len(shape) < 3 or shape[1] in (1, t))
    return shape if ok else ("does not broadcast to", (b, t, hv))


def _shapes(case) -> dict:
    """The contract's input shapes of a case (docs/contract.md)."""
    b, t, hk, hv, dk, dv = case.batch, case.seq_len, case.k_heads, case.v_heads, case.dk, case.dv
    if isinstance(case, MixerCase):
        return {"x": (b, t, case.channels), "conv_weight": (case.conv_width, case.channels),
                "a": (b, t, hv), "b": (b, t, hv), "a_log": _param(case.a_log_shape, b, t, hv),
                "dt_bias": _param(case.dt_bias_shape, b, t, hv)}
    shapes = {"q": (b, t, hk, dk), "k": (b, t, hk, dk), "v": (b, t, hv, dv), "g": (b, t, hv),
              "beta": (b, t, hv)}
    if case.has_initial_state:
        shapes["initial_state"] = (b, hv, dk, dv)
    return shapes


@pytest.mark.parametrize("prop_id", ["mixer_gradient_parity", "delta_rule_gradient_parity",
                                     "mixer_packed_gradient_parity", "packed_equals_separate"])
def test_every_change_is_a_case_the_builders_take(prop_id):
    """Each applicable change of drawn cases builds inputs of the changed
    shapes (a change that left a parameter's head or batch axis behind would
    be a case no target could take, and its diagnosis untried)."""
    tried = 0
    for case in _drawn(prop_id):
        for factor in diagnosis.FACTORS:
            if factor.applies(case):
                changed = factor.change(case)
                shapes = {n: x.shape for n, x in runners.case_inputs(changed).items()}
                assert shapes == _shapes(changed), (factor.name, changed, shapes)
                tried += 1
    assert tried


def test_one_cause_for_the_failure_classes_of_an_ignored_scale(tmp_path):
    """A kernel that drops scale=: every failure class of the forward parity
    passes with the default scale, and the summary and the JSON report give
    them as one cause."""
    report = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDN_")}
    env["GDN_COUNTEREXAMPLES"] = str(tmp_path / "counterexamples")
    proc = subprocess.run(
        [sys.executable, "-m", "verification.cli", "--target", IGNORES_SCALE, "--profile", "dev",
         "--properties", "delta_rule_forward_parity", "--jobs", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:]
    classes = json.loads(report.read_text())["properties"]["delta_rule_forward_parity"]["classes"]
    assert classes and all("the default scale" in c["diagnosis"]["passes_with"]
                           for c in classes.values()), classes
    summary = proc.stdout.split("gdn-verify summary", 1)[1]
    assert summary.count("    cause: passes with the default scale") == 1, summary[-3000:]
    path = next(iter(classes.values()))["file"]
    replay = subprocess.run([sys.executable, "-m", "verification.cli", "replay", path],
                            capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert replay.returncode == 1
    assert "diagnosis when found: passes with the default scale" in replay.stdout


def test_classes_of_the_same_changes_are_one_cause():
    from ..engine.harness import PropertyStats
    st = PropertyStats()
    same = {"cause": "passes with B = 1 (one change each)", "passes_with": ["B = 1"]}
    st.add_failure("dx float32 finite", 5.0, diagnosis=same)
    st.add_failure("db float32 finite", 9.0, diagnosis=same)
    st.add_failure("o float32 finite", 3.0, diagnosis={"cause": "x", "passes_with": []})
    st.add_failure("dg float32 finite", 2.0)
    assert list(causes(st.classes).values()) == [["db float32 finite", "dx float32 finite"],
                                         ["o float32 finite"], ["dg float32 finite"]]
