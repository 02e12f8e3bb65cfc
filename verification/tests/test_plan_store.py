"""The claim plans kept across runs (verification/engine/claims.py, the plan
store): a plan read back is the plan computed; its key changes with what the
plan reads (the property, the covering, what the target declares, the
suite's own strategies and properties), not with how the target is named;
read-only and opted-out stores write nothing. Data only: no kernel runs."""

import dataclasses
import os

import pytest
from hypothesis import settings

from ..engine import claims, program_store
from ..properties import load_all
from ..targets import Target
from ..targets.declaration import Supports

# one with claim cases in dev, one with a gate-only claim unmet there, a packed one
PROPERTIES = ("mixer_split_invariance", "delta_rule_forward_parity", "packed_gradient_parity")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The plan store in tmp_path, the dev profile loaded, no plan in memory."""
    def at(writable=True):
        monkeypatch.setattr(program_store, "directory",
                            lambda subdir=program_store.SUBDIR: (str(tmp_path / subdir), writable))
        monkeypatch.setattr(claims, "_PLANS", {})
        return tmp_path / claims.PLAN_SUBDIR
    previous = settings.get_current_profile_name()
    settings.load_profile("dev")
    yield at
    settings.load_profile(previous)


def _no_planning(*_):
    raise AssertionError("planned anew where a stored plan was expected")


@pytest.mark.parametrize("prop_id", PROPERTIES)
def test_a_stored_plan_is_the_plan_computed(prop_id, store, monkeypatch):
    folder = store()
    p, target = load_all()[prop_id], Target.parse("gdn_kernels:pallas")
    computed = claims.plan(p, target)
    assert len(os.listdir(folder)) == 1
    monkeypatch.setattr(claims, "_PLANS", {})
    monkeypatch.setattr(claims, "_plan", _no_planning)
    read = claims.plan(p, target)
    assert read.cases == computed.cases and dict(read.unmet) == dict(computed.unmet)
    assert set(read.claims) == set(computed.claims)


def test_one_kernel_under_two_specs_shares_its_plan_and_a_declaration_does_not(store, monkeypatch):
    folder = store()
    p, pallas = load_all()["mixer_split_invariance"], Target.parse("gdn_kernels:pallas")
    claims.plan(p, pallas)
    monkeypatch.setattr(claims, "_PLANS", {})
    monkeypatch.setattr(claims, "_plan", _no_planning)
    claims.plan(p, Target.parse("gdn_kernels:xla"))              # the same declaration
    assert len(os.listdir(folder)) == 1
    before = claims.target_fingerprint(pallas)
    narrower = dataclasses.replace(pallas.declaration, supports=Supports(dtypes=("float32",)))
    monkeypatch.setattr(Target, "declaration", property(lambda self: narrower))
    assert claims.target_fingerprint(pallas) != before
    with pytest.raises(AssertionError, match="planned anew"):
        claims.plan(p, pallas)


def test_the_key_holds_the_suites_source_and_the_covering(store, monkeypatch):
    store()
    key = ("mixer_split_invariance", "values", (), None, None)
    name = claims._plan_path(key)[0]
    assert claims._plan_path(key)[0] == name
    assert claims._plan_path(("mixer_split_invariance", "pairs", (), None, None))[0] != name
    monkeypatch.setattr(claims, "_suite_digest", lambda: "an edited strategy")
    assert claims._plan_path(key)[0] != name


def test_a_read_only_or_opted_out_store_writes_nothing(store, monkeypatch):
    p = load_all()["determinism"]
    folder = store(writable=False)
    claims.plan(p, Target.parse("gdn_kernels:pallas"))
    assert not folder.exists()
    monkeypatch.undo()
    monkeypatch.setattr(claims, "_PLANS", {})
    monkeypatch.setenv(program_store.OPT_OUT_ENV, "1")
    assert claims._plan_path(("determinism", "values", (), None, None)) is None


def test_a_stand_in_target_is_never_stored(store):
    folder = store()

    class StandIn:
        declaration = Target.parse("gdn_kernels:pallas").declaration

        def not_checkable(self, needs):
            return "declines everything" if needs else None

    plan = claims.plan(load_all()["determinism"], StandIn())
    assert plan.unmet and not folder.exists()
