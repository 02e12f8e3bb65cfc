"""Meta-tests: a property never passes, and never runs, on what the target
does not declare.

Each optional piece of a declaration (the mixer, sharded(), the l2norm
hooks, each Supports flag, a narrower dtype or chunk-size list) is taken
away in turn from a correct foreign target (float32_only_scan), whose
functions are wrapped to count their calls. Every property that needs the
piece is then "not checkable" without calling the target, and every drawn
case asking for it is a not-checkable row; the generated pytest test skips
(or, with --gdn-strict, fails) instead of passing.
"""

import dataclasses
import os
import re
import subprocess
import sys
import types

import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from gdn_kernels import GDNState
from verification import KernelDeclaration, Supports
from verification.fixture_kernels.foreign_targets import float32_only_scan as scan

from ..engine import harness
from ..targets.declaration import declaration_of, unmet
from ..engine.registry import PROPERTIES, is_not_checkable
from ..properties import load_all
from ..targets import Target, TargetError

load_all()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES_PER_PROPERTY = 4


class Spy:
    """A callable counting its calls (the target's functions)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


FULL = dict(gated_delta_rule=scan.gated_delta_rule, gdn_decoupled_conv1d=scan.gdn_decoupled_conv1d,
            l2norm_forward=scan.l2norm_forward, l2norm_backward=scan.l2norm_backward)

# piece taken away -> (declaration changes, the need it removes)
WITHOUT = {
    "core op": (dict(gated_delta_rule=None), "core"),   # a layer-only target
    "mixer": (dict(gdn_decoupled_conv1d=None), "mixer"),
    "sharded": ({}, "sharded"),                       # the scan has no sharded()
    "l2norm hooks": (dict(l2norm_forward=None, l2norm_backward=None), "l2norm_hooks"),
    "segment_ids": (dict(supports=Supports(segment_ids=False)), "segment_ids"),
    "initial_state": (dict(supports=Supports(initial_state=False)), "initial_state"),
    "carried_state": (dict(supports=Supports(carried_state=False)), "carried_state"),
    "incoming_conv_state": (dict(supports=Supports(incoming_conv_state=False)),
                            "incoming_conv_state"),
    "gva": (dict(supports=Supports(gva=False)), "gva"),
    "gva of its own": (dict(supports=Supports(kernel_gva=False)), "kernel_gva"),
    "validates_input": (dict(supports=Supports(validates_input=False)), "validates_input"),
    "bfloat16": (dict(supports=Supports(dtypes=("float32",))), "dtype:bfloat16"),
    "chunk 32": (dict(supports=Supports(chunk_sizes=(16, 64))), "chunk_size:32"),
}


def declared_target(name: str, **changes):
    """A target module (registered in sys.modules) exporting the scan's
    declaration with these changes, every function a Spy; (target, spies)."""
    fields = {k: (Spy(v) if callable(v) else v) for k, v in {**FULL, **changes}.items()}
    module = types.ModuleType(f"gdn_declared_{name.replace(' ', '_')}")
    module.GDN_KERNEL = KernelDeclaration(**fields)
    sys.modules[module.__name__] = module
    spies = [v for v in fields.values() if isinstance(v, Spy)]
    return Target.parse(module.__name__), spies


def drawn_cases(prop, n=CASES_PER_PROPERTY):
    """A few derandomized cases of the property's strategy, explicit examples first."""
    cases = list(prop.examples)

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=prop.strategy)
    def draw(case):
        cases.append(case)

    draw()
    return cases


def _needs(prop, case=None):
    return set(prop.needs) | (set(prop.case_needs(case)) if case is not None else set())


@pytest.mark.parametrize("piece", sorted(WITHOUT))
def test_a_missing_piece_is_not_checkable_and_never_called(piece):
    changes, need = WITHOUT[piece]
    target, spies = declared_target(piece, **changes)
    assert unmet(target.declaration, (need,)), f"{piece}: the declaration still meets {need}"
    needing = 0
    for prop in PROPERTIES.values():
        if need in prop.needs:
            verdict, stats = harness.verdict_of(prop, target, drawn_cases(prop))
            assert verdict == harness.NOT_CHECKABLE and stats.not_checkable, (prop.id, verdict)
            needing += 1
            continue
        for case in drawn_cases(prop):
            if need in _needs(prop, case):
                rows = harness.check_property(prop.id, target, case, record=False)
                assert len(rows) == 1 and is_not_checkable(rows[0]), (prop.id, rows)
                needing += 1
    assert needing, f"no property or drawn case needs {need}: the meta-test checks nothing"
    assert all(s.calls == 0 for s in spies), f"{piece}: the target ran on what it lacks"


def test_the_full_declaration_is_checkable_and_runs_the_target():
    """The control: with every piece, a case is checked on the target."""
    target, spies = declared_target("full")
    prop = PROPERTIES["delta_rule_forward_parity"]
    case = next(c for c in drawn_cases(prop) if not prop.not_checkable(target, c))
    verdict, _ = harness.verdict_of(prop, target, [case])
    assert verdict == harness.HELD and sum(s.calls for s in spies) > 0


def _conv_history_ignored(x, conv_weight, a, b, a_log, dt_bias, *, state=None, **kw):
    """The scan's mixer, starting every call from a zero conv history."""
    if state is not None:
        state = GDNState(jnp.zeros_like(state.conv), state.recurrent)
    return scan.gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, state=state, **kw)


def _state_gradient_cases(n=3):
    prop = PROPERTIES["state_gradient_parity"]
    return prop, [c for c in drawn_cases(prop, 8) if not c.segments][:n]


def test_an_ignored_incoming_conv_state_is_declared_and_its_gradient_never_passes():
    """A mixer that ignores the incoming conv state, declared so: the
    state's returned tensors and the incoming recurrent state's gradient are
    checked from a zero conv history, the conv history's gradient is a
    tensor not checkable (never a pass), --gdn-strict would fail it; the
    same kernel undeclared fails state_gradient_parity."""
    prop, cases = _state_gradient_cases()
    declared, _ = declared_target("conv history ignored", gdn_decoupled_conv1d=Spy(
        _conv_history_ignored), supports=Supports(incoming_conv_state=False))
    verdict, stats = harness.verdict_of(prop, declared, cases)
    assert verdict == harness.HELD and stats.checked == len(cases), (verdict, stats)
    assert set(stats.tensors_not_checkable) == {"dstate.conv"}, stats.tensors_not_checkable
    assert "ignores the incoming conv state" in stats.tensors_not_checkable["dstate.conv"]
    assert "dstate.conv" not in stats.worst and "drecurrent" not in stats.worst
    assert {"dstate.recurrent", "recurrent (one call)", "conv (one call)"} <= set(stats.worst)
    undeclared, _ = declared_target("conv history ignored, undeclared",
                                    gdn_decoupled_conv1d=_conv_history_ignored)
    assert harness.verdict_of(prop, undeclared, cases)[0] == harness.FAILED


def test_no_property_passes_on_a_target_that_checks_nothing():
    """Only the core op, supporting nothing optional, bfloat16 only: no
    property may report 'held' without having run the target."""
    target, spies = declared_target(
        "bare", gdn_decoupled_conv1d=None, l2norm_forward=None, l2norm_backward=None,
        supports=Supports(dtypes=("bfloat16",), segment_ids=False, initial_state=False,
                          carried_state=False, gva=False, scale=False, chunk_sizes=(128,),
                          validates_input=False))
    for prop in PROPERTIES.values():
        calls = sum(s.calls for s in spies)
        verdict, stats = harness.verdict_of(prop, target, drawn_cases(prop))
        ran = sum(s.calls for s in spies) > calls
        assert verdict == harness.NOT_CHECKABLE or (verdict == harness.HELD and ran
                                                    and stats.checked), (prop.id, verdict)


def test_a_layer_only_module_is_read_as_its_layer_and_a_declaration_needs_an_op():
    """A module defining only the mixer is a layer-only target (its core-op
    cases not checkable, with that reason); a declaration of neither op is
    refused, naming both."""
    layer = types.ModuleType("gdn_layer_only_plain")
    layer.gdn_decoupled_conv1d = scan.gdn_decoupled_conv1d
    declared = declaration_of(layer)
    assert declared.gated_delta_rule is None and declared.gdn_decoupled_conv1d is not None
    assert "no core op" in unmet(declared, ("core",)) and unmet(declared, ("mixer",)) is None
    with pytest.raises(TypeError, match="gated_delta_rule.*gdn_decoupled_conv1d"):
        KernelDeclaration()


def test_a_plain_module_is_read_as_the_whole_contract():
    declared = declaration_of(scan)
    assert declared.gdn_decoupled_conv1d is scan.gdn_decoupled_conv1d
    assert declared.l2norm_forward is scan.l2norm_forward and declared.sharded is None
    assert declared.supports == Supports()


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_here", ["no_such_module_here", "ModuleNotFoundError"]),
    ("json", ["'json'", "gated_delta_rule"]),
    ("verification.fixture_kernels.foreign_targets.float32_only_scan@data=2", ["sharded()"]),
    (":xla", ["no module name"]),
])
def test_a_bad_spec_names_the_spec_and_the_reason(spec, words):
    with pytest.raises(TargetError) as info:
        Target.parse(spec)
    assert all(w in str(info.value) for w in words) and "\n" not in str(info.value)


def test_a_declaration_rejects_what_is_not_callable():
    with pytest.raises(TypeError, match="gdn_decoupled_conv1d"):
        KernelDeclaration(gated_delta_rule=scan.gated_delta_rule, gdn_decoupled_conv1d=3)
    with pytest.raises(ValueError, match="float16"):
        KernelDeclaration(gated_delta_rule=scan.gated_delta_rule,
                          supports=Supports(dtypes=("float16",)))


def _pytest(*args, env=None):
    """The property tests in a subprocess, ci profile (derandomized)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "verification/tests/test_properties.py", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, GDN_PROFILE="ci", **(env or {})))


def test_not_checkable_is_a_skip_and_strict_fails_it():
    spec = "verification.fixture_kernels.author_fixture.my_kernels"
    plain = _pytest("--gdn-target", spec, "--gdn-properties",
                    "segment_ids_are_data,l2norm_scale_invariance", "--gdn-examples", "1")
    assert plain.returncode == 0 and "1 passed, 1 skipped" in plain.stdout, plain.stdout[-2000:]
    assert "SKIPPED" in plain.stdout and "declares no packed rows" in plain.stdout
    strict = _pytest("--gdn-target", spec, "--gdn-properties", "segment_ids_are_data",
                     "--gdn-strict")
    assert strict.returncode == 1 and "--gdn-strict" in strict.stdout, strict.stdout[-2000:]


def test_known_failures_xfail_and_a_stale_entry_fails(tmp_path):
    known = tmp_path / "known.txt"
    known.write_text("# planted: beta applied twice\n"
                     "delta_rule_forward_parity | | beta applied twice (a mutant)\n"
                     "mixer_forward_parity | o | beta applied twice (a mutant)\n")
    proc = _pytest("--gdn-target", "gdn_mutant_beta_applied_twice:xla",
                   "--gdn-properties", "delta_rule_forward_parity,mixer_forward_parity",
                   "--gdn-examples", "6", f"--gdn-known-failures={known}")
    assert proc.returncode == 0 and "2 xfailed" in proc.stdout, proc.stdout[-2000:]
    stale = _pytest("--gdn-target", "verification.fixture_kernels.foreign_targets.float32_only_scan",
                    "--gdn-properties", "delta_rule_forward_parity", "--gdn-examples", "2",
                    f"--gdn-known-failures={known}")
    assert stale.returncode == 1 and "XPASS(strict)" in stale.stdout, stale.stdout[-2000:]
    bad = tmp_path / "bad.txt"
    bad.write_text("no_such_property | | why\n")
    usage = _pytest("--gdn-target", "gdn_kernels:xla", f"--gdn-known-failures={bad}")
    assert usage.returncode == 4 and "no_such_property" in usage.stderr + usage.stdout


def test_the_plugin_is_inert_without_a_target(tmp_path):
    """Installed, in a session that names no target: no flag, environment
    or profile change, no test of ours collected."""
    (tmp_path / "test_mine.py").write_text(
        "import os\nfrom hypothesis import settings\n"
        "def test_untouched():\n"
        "    assert os.environ.get('XLA_FLAGS') is None\n"
        "    assert settings.get_current_profile_name() == 'default'\n")
    # (CI unset: Hypothesis itself loads a "ci" profile where CI is set)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GDN_", "XLA_FLAGS")) and k != "CI"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:]
    assert "gdn-verify" not in proc.stdout


def test_what_declares_nothing_optional_lists_its_needs():
    """Every need a property declares is one a declaration can lack."""
    from ..targets.declaration import NEEDS
    for prop in PROPERTIES.values():
        for need in prop.needs:
            assert need in NEEDS or need.startswith("chunk_size:"), (prop.id, need)
    assert {n for p in PROPERTIES.values() for n in p.needs} >= {
        "sharded", "l2norm_hooks", "segment_ids", "carried_state", "validates_input"}
    assert dataclasses.fields(Supports)


def test_chunk_sizes_beyond_the_contract_are_drawn_only_for_a_target_declaring_them():
    """256 (beyond the contract's 16..128, as field kernels use): its lattice
    rows are drawn in dev and ci once the session's target declares it,
    and never otherwise; a contract target meets such a case as not
    checkable, a declaring one is checked."""
    from hypothesis import find
    from hypothesis.errors import NoSuchExample
    from strategies import lattice
    quick = settings(max_examples=2000, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    parity = [PROPERTIES[p] for p in ("delta_rule_forward_parity", "mixer_forward_parity")]
    previous = settings.get_current_profile_name()
    declaring = Target.parse("verification.fixture_kernels.foreign_targets.bf16_compute_chunked")
    wide = []
    try:
        lattice.declare_beyond_contract(declaring.declaration.supports.chunk_sizes)
        for profile in ("dev", "ci"):
            settings.load_profile(profile)
            wide += [find(p.strategy, lambda c: c.chunk == 256, settings=quick) for p in parity]
    finally:
        lattice.declare_beyond_contract(())
        settings.load_profile(previous)
    for p in parity:
        with pytest.raises(NoSuchExample):
            find(p.strategy, lambda c: c.chunk == 256, settings=quick)
    for p, case in zip(parity * 2, wide):
        assert harness.verdict_of(p, declaring, [case])[0] == harness.HELD
        verdict, stats = harness.verdict_of(p, Target.parse("gdn_kernels:xla"), [case])
        assert verdict == harness.NOT_CHECKABLE and "not 256" in harness.reasons_text(stats)


# --- declared limits (KernelDeclaration.limits) -----------------------------

WHOLE_CHUNKS = "verification.fixture_kernels.foreign_targets.whole_chunks_layer"


def test_limits_are_checked_where_declared():
    from verification import Limits
    for bad in (dict(min_seq_len=0), dict(min_seq_len=8, max_seq_len=4),
                dict(batch_sizes=()), dict(batch_sizes=(0,)), dict(param_ranks=(4,)),
                dict(per_batch_params_at=(1.5,))):
        with pytest.raises(ValueError, match="limits"):
            Limits(**bad)
    with pytest.raises(TypeError, match="limits"):
        KernelDeclaration(gdn_decoupled_conv1d=scan.gdn_decoupled_conv1d, limits={})


def test_cases_are_drawn_inside_the_declared_limits():
    """With a target's limits declared, the lattice is built inside them:
    every drawn case is one it takes (whole chunks, [Hv] or [1, Hv]
    parameters, a batch axis only at B = 1), in the dev and ci coverings;
    without them, the contract's lattice is unchanged."""
    from strategies import lattice
    from ..fixture_kernels.foreign_targets.whole_chunks_layer import LIMITS
    unlimited = (lattice.mixer_geometries(), lattice.delta_geometries())
    previous = settings.get_current_profile_name()
    lattice.declare_limits(LIMITS)
    try:
        for profile in ("dev", "ci"):
            settings.load_profile(profile)
            for prop in ("mixer_gradient_parity", "cotangent_shapes_and_dtypes"):
                cases = drawn_cases(PROPERTIES[prop], n=30)[len(PROPERTIES[prop].examples):]
                assert cases and all(LIMITS.refuses_case(c) is None for c in cases), prop
                assert {c.seq_len // c.chunk for c in cases} >= {1, 2}, prop
    finally:
        lattice.declare_limits(None)
        settings.load_profile(previous)
    assert (lattice.mixer_geometries(), lattice.delta_geometries()) == unlimited
    assert len(unlimited[0]) == 68 and len(unlimited[1]) == 45


@pytest.mark.long_running
def test_a_kernel_declared_as_it_is_holds_inside_its_limits():
    """The layer-only kernel with limits, declared so: what it takes holds
    (causality appends a whole chunk, a length it takes); a property whose
    check calls it at other shapes (a rerun at [B, T, Hv] parameters) is not
    checkable, naming the limit; the core op's property is not checkable
    (no core op); nothing raised. Declared
    without its limits, the same kernel raises on the contract's shapes:
    FAILED, with the exception's class and message, counted as raised."""
    props = "mixer_gradient_parity,param_gradient_is_broadcast_sum,causality,split_invariance"
    proc = _pytest("--gdn-target", WHOLE_CHUNKS, "--gdn-properties", props,
                   "--gdn-examples", "2")
    out = proc.stdout
    assert proc.returncode == 0 and "2 passed, 2 skipped" in out, out[-3000:]
    assert re.search(r"^causality\s+held", out, re.M), out[-3000:]
    assert "calls the target outside its declared limits (the target takes a_log" in out
    assert "the target exposes no core op" in out and "raised" not in out
    undeclared = _pytest("--gdn-target", f"{WHOLE_CHUNKS}_undeclared", "--gdn-properties",
                         "mixer_forward_parity", "--gdn-examples", "2")
    out = undeclared.stdout
    assert undeclared.returncode == 1, out[-3000:]
    assert "failure class raised ValueError" in out and "is not a multiple of chunk_size" in out
    assert "raised (not checked)" in out, out[-3000:]


IGNORES_SCALE = "verification.fixture_kernels.wrong_targets.ignores_scale"


@pytest.mark.parametrize("prop_id", ["delta_rule_forward_parity", "mixer_gradient_parity"])
def test_a_target_that_ignores_scale_fails_where_a_scale_is_drawn(prop_id):
    """scale= is drawn, the default and another value (a column of the
    lattice's rows): a kernel that takes the argument and drops it fails on
    the cases that pass another value, and holds on the same cases at the
    default; a target declaring no scale= is never given one."""
    prop = PROPERTIES[prop_id]
    drawn = drawn_cases(prop, 30)
    scaled = [c for c in drawn if c.scale is not None][:2]
    assert scaled and any(c.scale is None for c in drawn), "both scales are drawn"
    target = Target.parse(IGNORES_SCALE)
    assert harness.verdict_of(prop, target, scaled)[0] == harness.FAILED
    default = [dataclasses.replace(c, scale=None) for c in scaled]
    assert harness.verdict_of(prop, target, default)[0] == harness.HELD
    fixed, _ = declared_target("no scale", supports=Supports(scale=False))
    assert "no scale= argument" in unmet(fixed.declaration, prop.case_needs(scaled[0]))
