"""Meta-tests: the suite can fail, and its strategies reach what they claim.

Every registered property is shown failing on its declared wrong target (a
seeded-bug mutant of gdn_kernels, or a wrapper in verification/fixture_kernels/wrong_targets);
its strategy reaches each of its coverage claims; every mutant's killers are
registered properties. For the three bugs this project exists to catch, the
counterexample file written on failure replays to the same failure (and
passes on the correct target)."""

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from strategies import lattice
from strategies.cases import shape_of

from ..engine import claims, counterexamples, harness, mesh_worker
from ..cli import replay
from ..mutants import MUTANTS, PatchError, apply_patch, changed_functions, mutated_source
from ..engine.registry import FAMILIES, PROPERTIES, PropertyFailure, claim_needs, met_by_shape
from ..properties import load_all
from ..targets import DEFAULT_TARGET, Target, declare_to_lattice

load_all()

_FAST = dict(deadline=None, derandomize=True, database=None, max_examples=40,
             suppress_health_check=list(HealthCheck))


def _hunt(prop_id: str, target: Target, shrink: bool):
    """Run the property's own strategy against `target`; return the failure."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    strategy = PROPERTIES[prop_id].strategy

    @settings(phases=phases, **_FAST)
    @given(case=strategy)
    def hunt(case):
        harness.check_property(prop_id, target, case, record=False)

    harness.session().last_failure.clear()
    with pytest.raises(Exception) as info:
        hunt()
    return info.value


def _failures(prop_id: str) -> dict:
    """failure class -> (case, target, rows): prop_id's recorded failures."""
    return {klass: found for (prop, klass), found in harness.session().last_failure.items()
            if prop == prop_id}


def test_registry_is_complete():
    """Every family has properties, every property a wrong target, a
    strategy, a doc line and a positive weight; mutant killers exist."""
    assert {p.family for p in PROPERTIES.values()} == set(FAMILIES)
    for p in PROPERTIES.values():
        assert p.wrong_target and p.doc and p.weight > 0, p.id
    for mutant in MUTANTS.values():
        unknown = set(mutant.killers) - set(PROPERTIES)
        assert not unknown, f"mutant {mutant.name}: unknown killer(s) {unknown}"


@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_property_fails_on_its_wrong_target(prop_id):
    err = _hunt(prop_id, Target.parse(PROPERTIES[prop_id].wrong_target), shrink=False)
    assert _failures(prop_id), f"{prop_id} did not record a failing case: {err!r}"


@pytest.mark.parametrize("profile", ("dev", "ci"))     # the two coverings of the lattice
@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_every_run_meets_every_claim(prop_id, profile):
    """The cases a run of the property starts with (its explicit examples,
    then its claim cases, as the harness builds them for our default
    target; data only, no kernel runs) meet every claim the profile holds
    it to; only the gate-only claims are unmet in dev, with that reason.
    And each claim case is needed: without it, some claim goes unmet."""
    p = PROPERTIES[prop_id]
    assert p.covers, f"{prop_id} declares no coverage claim"
    previous = settings.get_current_profile_name()
    settings.load_profile(profile)
    try:
        plan = claims.plan(p, Target.parse(DEFAULT_TARGET))
    finally:
        settings.load_profile(previous)
    run = p.examples + plan.cases
    assert set(plan.claims) >= set(p.covers) and not claims.unmet_by(plan.claims, run), plan
    gate_only = ({c: p.gate_only_why or claims.GATE_ONLY for c in p.gate_covers}
                 if profile == "dev" else {})
    assert dict(plan.unmet) == gate_only
    for i in range(len(plan.cases)):
        fewer = p.examples + plan.cases[:i] + plan.cases[i + 1:]
        assert claims.unmet_by(plan.claims, fewer), f"claim case {i} meets no claim alone"
    for case in run:                  # what a claim declares every meeting case asks, each asks
        for name in claims.claims_met(plan.claims, case):
            assert set(claim_needs(plan.claims[name])) <= set(p.case_needs(case)), (name, case)


@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_what_every_case_of_a_property_asks_is_asked_by_each(prop_id):
    """The needs the registry takes every case of a property to ask (its
    strategy's case type; a target lacking one makes the property not
    checkable before any case is drawn), and those each claim declares
    (registry.claim: unmet on such a target without a search), are asked by
    each of its explicit examples and drawn cases (meeting the claim): a
    property or a claim is never ruled out on a target that could take
    some of its cases. Data only."""
    p = PROPERTIES[prop_id]
    every = set(p.needs_of_every_case())

    @settings(max_examples=20, phases=[Phase.generate], **{k: v for k, v in _FAST.items()
                                                           if k != "max_examples"})
    @given(case=p.strategy)
    def drawn(case):
        assert every <= set(p.case_needs(case)), (case, every)
        for name, predicate in {**p.covers, **p.gate_covers}.items():
            if claim_needs(predicate) and predicate(case):
                assert set(claim_needs(predicate)) <= set(p.case_needs(case)), (name, case)

    drawn()
    for case in p.examples:
        assert every <= set(p.case_needs(case)), (case, every)


def test_a_target_lacking_what_every_case_asks_is_ruled_out_before_a_draw():
    """A layer-only target: each core-op property is not checkable on it
    as a whole, with the reason (no claim plan drawn, no example refused)."""
    layer_only = _Lacking(Target.parse(DEFAULT_TARGET), "core",
                          "the target exposes no core op (gated_delta_rule): a layer-only target")
    core_op = [p for p in PROPERTIES.values() if "core" in p.needs_of_every_case()]
    assert {"delta_rule_forward_parity", "delta_rule_gradient_parity",
            "split_invariance"} <= {p.id for p in core_op}
    for p in core_op:
        assert "a layer-only target" in p.not_checkable(layer_only), p.id
    assert PROPERTIES["mixer_gradient_parity"].not_checkable(layer_only) is None




@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_a_shape_claim_is_met_by_the_shape_alone(prop_id):
    """Each claim declared met by a case's shape alone (registry.shape_claim)
    is met or not by each explicit example and each of 20 drawn cases as by
    its shape (strategies.cases.shape_of: every field drawn apart from the
    lattice row at its default), and each drawn case's shape is one its
    strategy says it draws on (shape_cases()): such a claim is ruled out
    from those shapes only where no case of theirs could meet it. Data only."""
    p = PROPERTIES[prop_id]
    by_shape = {name: predicate for name, predicate in {**p.covers, **p.gate_covers}.items()
                if met_by_shape(predicate)}
    shape_cases = getattr(p.strategy, "shape_cases", None)
    shapes = set(shape_cases()) if shape_cases else None

    def check(case):
        shape = shape_of(case)
        for name, predicate in by_shape.items():
            assert bool(predicate(case)) == bool(predicate(shape)), (name, case)

    @settings(max_examples=20, phases=[Phase.generate], **{k: v for k, v in _FAST.items()
                                                           if k != "max_examples"})
    @given(case=p.strategy)
    def drawn(case):
        check(case)
        assert shapes is None or shape_of(case) in shapes, case

    if by_shape or shapes:
        drawn()
        for case in p.examples:
            check(case)


def test_limits_rule_out_a_shape_claim_before_any_draw():
    """A target declaring whole chunks, [Hv] or [B, Hv] parameters and a
    batch axis at B = 1 only: the shape claims no row of the lattice within
    those limits meets (T=1, T=C+1, C=128, a [B, Hv] a_log...) are unmet
    with that reason, known from the rows; the search then stops at the
    claims it can meet, every one of which it meets (no claim is left to
    the 2,000-draw search's reason)."""
    target = Target.parse("verification.fixture_kernels.foreign_targets.whole_chunks_layer")
    saved = (lattice.declared_beyond_contract(), lattice.declared_limits(),
             dict(lattice.declared_knob_values()))
    previous = settings.get_current_profile_name()
    declare_to_lattice(target.declaration)
    try:
        settings.load_profile("ci")
        plans = {name: claims._plan(PROPERTIES[name], "pairs", target)
                 for name in ("mixer_gradient_parity", "mixer_packed_equals_separate")}
    finally:
        settings.load_profile(previous)
        lattice.declare_beyond_contract(saved[0])
        lattice.declare_limits(saved[1])
        lattice.declare_knob_values(saved[2])
    shape_reason = "ruled out by the target's declared limits: no shape of the property's lattice"
    assert {"T=1", "C=128", "[B,Hv] a_log", "[B,T,Hv] dt_bias"} <= {
        name for name, why in plans["mixer_gradient_parity"].unmet.items()
        if why.startswith(shape_reason)}
    assert {"[B,T,Hv] a_log", "[B,Hv] dt_bias"} <= {
        name for name, why in plans["mixer_packed_equals_separate"].unmet.items()
        if why.startswith(shape_reason)}
    for name, plan in plans.items():
        assert not any("draws" in why for why in plan.unmet.values()), (name, plan.unmet)
        assert plan.cases and all(target.declaration.limits.refuses_case(c) is None
                                  for c in plan.cases), name


def test_a_claim_no_case_meets_is_reported_with_its_reason():
    """A claim the target refuses every case of, and one the strategy never
    reaches, are reported unmet with why (never dropped); the others met."""
    p = PROPERTIES["mixer_split_invariance"]
    odd = dataclasses.replace(p, id="claims_meta_probe", covers={
        **p.covers, "T=10000": lambda c: c.seq_len == 10000})
    refusing = _Lacking(Target.parse(DEFAULT_TARGET), "dtype:bfloat16",
                        "the target declares no bfloat16")
    previous = settings.get_current_profile_name()
    settings.load_profile("dev")
    try:
        plan = claims._plan(odd, "values", None)
        refused = claims._plan(dataclasses.replace(odd, needs=()), "values", refusing)
    finally:
        settings.load_profile(previous)
    assert set(plan.unmet) == {"T=10000"} and "2000 draws" in plan.unmet["T=10000"]
    assert "bfloat16" in refused.unmet and "does not take" in refused.unmet["bfloat16"]
    assert not claims.unmet_by({k: v for k, v in plan.claims.items() if k != "T=10000"},
                               plan.cases)


class _Lacking:
    """A target lacking one need (with this reason), else the target it wraps
    (for the probes above)."""
    def __init__(self, target, need: str, reason: str):
        self.target, self.declaration = target, target.declaration
        self.need, self.reason = need, reason

    def not_checkable(self, needs):
        if self.need in needs:
            return self.reason
        return self.target.not_checkable(needs)


ROUND_TRIPS = [
    ("near_zero_rows_vjp_parity", "gdn_mutant_l2norm_bwd_eps_1e12:xla"),        # eps 1e-12 vs 1e-6
    ("cotangent_shapes_and_dtypes", "gdn_mutant_param_grad_axis_01:xla"),       # axis=(0, 1)
    ("delta_rule_forward_parity", "gdn_mutant_tail_padded_with_edge_tokens:xla"),  # tail chunk
]


@pytest.mark.parametrize("prop_id, wrong", ROUND_TRIPS)
def test_counterexample_file_replays_to_the_same_failure(prop_id, wrong, tmp_path, capsys):
    target = Target.parse(wrong)
    _hunt(prop_id, target, shrink=True)
    klass, (case, failing_target, rows) = sorted(_failures(prop_id).items())[0]
    path = counterexamples.write(prop_id, case, failing_target.spec, "test", rows,
                                 "", folder=str(tmp_path), failure_class=klass)
    record = counterexamples.load(path)
    assert record["case_obj"] == case and record["target"] == wrong
    assert replay(path, None) == 1                      # still fails on the wrong target
    assert f"STILL FAILS: {prop_id} [{klass}]" in capsys.readouterr().out
    assert replay(path, "gdn_kernels:xla") == 0         # and holds on the real one
    assert replay(path, None, module="gdn_kernels") == 0  # the same impl, unmutated
    with pytest.raises(Exception) as again:   # the same failure, rerun directly
        mesh_worker.run(PROPERTIES[prop_id], target, record["case_obj"])
    if rows:
        assert isinstance(again.value, PropertyFailure)


TWO_CLASSES = "verification.fixture_kernels.wrong_targets.two_failure_classes"


def test_each_failure_class_gets_its_own_counterexample(tmp_path, capsys):
    """Two planted bugs of different classes (a bf16-only final-state
    rounding, a NaN float32 dg on some inputs) in one property's run: two
    counterexample files, each replaying to its own class, and the
    summary's worst row (the non-finite dg) names the dg file."""
    import glob
    from .test_declared_targets import _pytest
    prop = "delta_rule_gradient_parity"
    proc = _pytest("--gdn-target", TWO_CLASSES, "--gdn-properties", prop,
                   env={"GDN_COUNTEREXAMPLES": str(tmp_path)})
    assert proc.returncode == 1, proc.stdout[-3000:]
    files = {counterexamples.load(f)["failure_class"]: f
             for f in glob.glob(str(tmp_path / "*.json"))}
    assert sorted(files) == ["dg float32 non-finite", "final_state bfloat16 finite"], files
    for klass, path in files.items():
        assert replay(path, None) == 1
        out = capsys.readouterr().out
        assert f"STILL FAILS: {prop} [{klass}]" in out and "recorded as" not in out, out
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith(f"{prop} ")]
    assert "dg: rel inf" in row and row.endswith(files["dg float32 non-finite"]), row
    _the_report_an_author_reads(proc.stdout, prop, files, tmp_path)


def _the_report_an_author_reads(stdout: str, prop: str, files: dict, folder) -> None:
    """A failing run's terminal: the summary is its last block, no traceback
    through the suite's frames, one line per failure class with the shrunk
    case's ratio beside the worst seen; the rest in the property's report
    file beside its counterexamples."""
    lines = stdout.splitlines()
    sections = [i for i, line in enumerate(lines) if line.startswith("====")]
    assert "gdn-verify summary" in lines[sections[-1]], lines[sections[-1]:]
    assert "harness.py" not in stdout and "Traceback" not in stdout, stdout[-3000:]
    for klass, path in files.items():
        (line,) = [x for x in lines if x.startswith(f"  [{klass}] shrunk case ratio ")]
        assert "(worst seen " in line and line.endswith(f"gdn-verify replay {path}"), line
        (summary_row,) = [x for x in lines[sections[-1]:]
                          if x.lstrip().startswith(f"failure class {klass}:")]
        assert "shrunk case ratio" in summary_row and "worst seen" in summary_row, summary_row
    detail = (folder / f"{prop}.failure.txt").read_text()
    assert all(f"gdn-verify counterexample [{klass}]" in detail for klass in files), detail
    assert "harness.py" in detail        # the traceback is kept there, for the suite's authors


# The state family's split kinds, one seeded bug each (verification/mutants/catalog.py).
SPLIT_KIND_MUTANTS = ("one_token_call_conv_state_not_shifted", "short_call_history_dropped",
                      "chunk_edge_state_decayed_twice", "one_token_call_state_gradient_dropped")


@pytest.mark.long_running
@pytest.mark.parametrize("name", SPLIT_KIND_MUTANTS)
def test_split_kind_mutants_are_killed_in_the_dev_loop(name, tmp_path):
    """Each split kind's mutant is killed by the split property in the dev
    profile (the user's main job: 2 drawn examples of that property, a
    fresh example database), as the mutation run kills it in the kill
    profile: the run's claim cases meet every split kind, every time."""
    import json
    import subprocess
    import sys
    from ..mutants import materialize
    from ..mutants.runner import PROPERTY_TESTS, _env, _killer
    stats_file = str(tmp_path / "stats.json")
    env = _env(str(tmp_path), stats_file)
    env.update(GDN_PROFILE="dev", GDN_HYPOTHESIS_DB=str(tmp_path / "db"))
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", PROPERTY_TESTS, "-p", "gdn_verify", "-x", "-q",
         "--gdn-target", f"{materialize(name)}:xla", "-p", "no:cacheprovider",
         "--gdn-properties", "mixer_split_invariance", "-p", "no:xdist"],
        env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 1, ran.stdout[-3000:]
    with open(stats_file) as f:
        assert _killer(json.load(f))[0] == "mixer_split_invariance"


def test_two_failure_classes_in_two_pinned_examples_are_both_reported():
    """Two pinned cases of one property failing in two classes (the
    two-class target: a bf16 final state rounded, a NaN float32 dg under
    strong decay after token 16): both run, whatever the first found; each
    failure is recorded with its class and its case; the summary lists both."""
    from strategies.explicit import delta_case
    from ..summary import failure_class_lines
    prop = "delta_rule_gradient_parity"
    cases = (delta_case("plain", 1, 33, 16, seed=3, gate_regime="strong_decay"),
             delta_case("plain", 1, 33, 16, seed=4, dtype="bfloat16"))
    previous = harness.session()
    harness.begin_session(harness.Session())
    try:
        stats = harness.session().stats.setdefault(prop, harness.PropertyStats())
        failures = harness.run_pinned(PROPERTIES[prop], Target.parse(TWO_CLASSES), cases, stats,
                                      stop_at_first=False)
        recorded = {klass: case for (p, klass), (case, _, _) in
                    harness.session().last_failure.items() if p == prop}
    finally:
        harness.begin_session(previous)
    classes = ["dg float32 non-finite", "final_state bfloat16 finite"]
    assert len(failures) == 2 and sorted(stats.classes) == classes, (failures, stats.classes)
    assert recorded == dict(zip(classes, cases)) and stats.examples == 2
    lines = failure_class_lines(stats)
    assert all(any(f"failure class {k}:" in line for line in lines) for k in classes), lines
    harness.begin_session(harness.Session())
    try:
        one = harness.run_pinned(PROPERTIES[prop], Target.parse(TWO_CLASSES), cases,
                                 harness.PropertyStats(), stop_at_first=True)
    finally:
        harness.begin_session(previous)
    assert len(one) == 1                    # the kill profile: the first failure is enough


def test_a_mutated_kernel_is_another_program_for_the_compile_cache():
    """Mutant processes read the persistent compile cache, whose key hashes
    the program with its debug info stripped: a mutated kernel lowers to a
    different program (so it can never be served the original's entry),
    while code the patch left alone (the oracle) lowers to the same one."""
    import importlib

    import jax
    import numpy as np

    import gdn_kernels
    from ..mutants import materialize

    mutant = importlib.import_module(materialize("no_decay_between_chunks"))
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 40, 1, 8)).astype(np.float32)
    g = -rng.uniform(0, 1, (1, 40, 1)).astype(np.float32)
    beta = rng.uniform(0, 1, (1, 40, 1)).astype(np.float32)

    def program(module, impl):
        run = jax.jit(lambda *a: module.gated_delta_rule(*a, chunk_size=16, impl=impl))
        return run.lower(q, q, q, g, beta).as_text(debug_info=False)

    for impl in MUTANTS["no_decay_between_chunks"].impls:
        assert program(mutant, impl) != program(gdn_kernels, impl), impl
    assert program(mutant, "reference") == program(gdn_kernels, "reference")


def test_a_kill_without_its_killing_example_fails_the_baseline(tmp_path):
    from ..mutants.runner import SessionWorker, replay_killing_examples
    record = {"mutant": "no_decay_between_chunks", "impl": "xla", "killed": True,
              "killing_example": None}
    baseline = replay_killing_examples([record], [SessionWorker(None, str(tmp_path))])
    assert not baseline["passed"] and "no_decay_between_chunks:xla" in baseline["log_tail"]


def test_sessions_in_one_worker_kill_as_fresh_processes_do(tmp_path):
    """Two mutants' sessions one after another in one worker process, then
    their killing examples replayed there on the unmutated package: the same
    killers and examples to kill as a fresh pytest process per mutant (the
    kill profile draws the same examples wherever it runs); a worker that
    dies is an error of its session, and the next session gets a new one."""
    import json
    import subprocess
    import sys
    from ..mutants import materialize
    from ..mutants.runner import (PROFILE, PROPERTY_TESTS, SessionWorker, _env, _killer,
                                 replay_killing_examples, run_suite_process)
    worker = SessionWorker(None, str(tmp_path))
    cases = [("l2norm_bwd_eps_1e12", "near_zero_rows_vjp_parity"),
             ("no_decay_between_chunks", "mixer_forward_parity")]
    try:
        results = []
        for name, killer in cases:
            target = f"{materialize(name)}:xla"
            ran = run_suite_process(worker, target, [killer], str(tmp_path / name))
            stats_file = str(tmp_path / f"{name}-fresh.json")
            env = _env(str(tmp_path / f"{name}-fresh"), stats_file)
            fresh = subprocess.run(
                [sys.executable, "-m", "pytest", PROPERTY_TESTS, "-p", "gdn_verify", "-x",
                 "-q", "--hypothesis-profile", PROFILE, "--gdn-target", target, "-p",
                 "no:cacheprovider", "--gdn-properties", killer, "-p", "no:xdist"],
                env=env, capture_output=True, text=True, timeout=600)
            assert fresh.returncode == ran["returncode"] == 1, (fresh.stdout[-2000:],
                                                               ran["tail"])
            with open(stats_file) as f:
                assert _killer(ran["stats"]) == _killer(json.load(f)) != (None, None)
            results.append({"mutant": name, "impl": "xla", "killed": True,
                            "killing_example": ran["counterexamples"][0]})
        baseline = replay_killing_examples(results, [worker])
        assert baseline["passed"] and baseline["replayed"] == 2, baseline["log_tail"]
        (tmp_path / "test_dies.py").write_text("import os\nos._exit(9)\n")
        dead = worker.run([str(tmp_path / "test_dies.py"), "-p", "no:cacheprovider"], {})
        assert dead["returncode"] == 3 and "died" in dead["tail"], dead
        again = worker.run(["--version"], {})
        assert again["returncode"] == 0, again["tail"]
    finally:
        worker.close()


def test_processes_materialising_one_mutant_at_once_share_one_copy(tmp_path):
    """The two impl runs of one mutant (and any other processes) may
    materialise the same mutated package at the same moment: every one of
    them gets a complete package and none fails."""
    import os
    import subprocess
    import sys
    name = next(iter(MUTANTS))
    code = ("import sys; from verification.mutants import materialize; "
            "print(materialize(sys.argv[1]))")
    env = dict(os.environ, GDN_MUTANT_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), [err for _, err, _ in results]
    package = tmp_path / f"gdn_mutant_{name}"
    assert (package / MUTANTS[name].file).read_text().count(MUTANTS[name].new) >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [package.name]


def test_a_mutant_is_anchored_on_its_function():
    """A patch site applies only inside the mutant's function; when the
    function is renamed or the site leaves it, the error names the
    function."""
    mutant = MUTANTS["no_decay_between_chunks"]
    source, mutated = mutated_source(mutant.name)
    assert changed_functions(source, mutated, mutant.file) == [f"<module>.{mutant.function}"]
    renamed = source.replace(f"def {mutant.function}(", "def renamed_step(")
    with pytest.raises(PatchError, match=f"function \\['{mutant.function}'\\] not found"):
        apply_patch(renamed, mutant)
    moved = source + "\n\ndef elsewhere(k, intra, new_values, s0):\n" + mutant.old + "\n"
    moved = moved.replace(mutant.old, "    pass", 1)
    with pytest.raises(PatchError, match=f"in function {mutant.function} of"):
        apply_patch(moved, mutant)
