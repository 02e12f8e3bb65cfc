"""Glue between the registered properties and pytest/Hypothesis: the test
generated for each property, its verdict, per-property statistics for the
summary, and the last failing case of each property's failure classes
(tolerance.failure_class) for their counterexample files.

A property's verdict on a target is one of
  held           every example it checked held
  FAILED         an example failed (a counterexample file is written)
  not checkable  no example could be checked: the target does not declare
                 what the property needs (or, with --gdn-strict, any example
                 could not be checked: then it fails)
  xfail          every failure is listed in the known-failures file
  XPASS          a listed known failure did not fail: the run fails
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import pytest
from hypothesis import Phase, given, reject, settings
from hypothesis.errors import Unsatisfiable

from strategies import lattice
from strategies.cases import MixerCase

from . import claims, known_failures, mesh_worker, runners, watchdog
from .profiles import CLAIM_CASES_IN_BUDGET
from .registry import (Property, PropertyFailure, classed, is_not_checkable,
                       is_tensor_not_checkable, not_checkable_row)
from ..properties import load_all
from ..tolerance import TensorError, failure_class, raised_class, raised_message, tensor_of

MARKER = "gdn_property"

HELD, FAILED, NOT_CHECKABLE, XFAIL, XPASS = "held", "FAILED", "not checkable", "xfail", "XPASS"
NO_CASE_WITHIN_LIMITS = "no shape of the property's lattice lies within the target's declared limits"


@dataclasses.dataclass
class RunOptions:
    """How verdicts are reached in this session (set by the plugin)."""
    strict: bool = False                     # --gdn-strict: not checkable fails
    known: Tuple[known_failures.KnownFailure, ...] = ()




def _add_beyond(table: Dict[str, dict], tensor: str, ratio: float, examples: int) -> None:
    d = table.setdefault(tensor, {"examples": 0, "worst": 0.0})
    d["examples"] += examples
    d["worst"] = max(d["worst"], ratio)


@dataclasses.dataclass
class PropertyStats:
    examples: int = 0             # examples the target ran on
    failures: int = 0
    seconds: float = 0.0
    compiles: int = 0
    compile_s: float = 0.0        # of seconds: tracing, lowering and compiling new programs
    first_failure_at: int = 0     # 1-based example index of the first failure
    not_checkable: int = 0        # examples that could not be checked (declared or numeric)
    unresolved: int = 0           # of those, examples the target ran on (numeric reasons)
    raised: int = 0               # examples whose check raised (the target, on a case
                                  # it declares it takes): failures, never "checked"
    known_failures: int = 0       # failing examples covered by the known-failures file
    mixer_examples: int = 0       # of examples, those of the mixer (rows labelled by
                                  # the target's mixer_label)
    verdict: str = ""
    reasons: Dict[str, int] = dataclasses.field(default_factory=dict)   # not checkable: why
    worst: Dict[str, TensorError] = dataclasses.field(default_factory=dict)
    # failure class (tolerance.failure_class) -> {"examples", "worst" (the
    # worst ratio seen while searching and shrinking), "file" (its
    # counterexample, once written), "shrunk" (that counterexample's ratio),
    # "diagnosis" (diagnosis.Diagnosis.to_json of that counterexample)}
    classes: Dict[str, dict] = dataclasses.field(default_factory=dict)
    # tensor -> {"examples", "worst"}: rows that held only at the target's
    # declared precision (tolerance.DEVIATES), worst = ratio at the contract's bound
    deviations: Dict[str, dict] = dataclasses.field(default_factory=dict)
    # tensor -> {"examples", "worst"}: rows that held only at the target's
    # declared tolerance, worst = ratio at the policy's bound
    tolerated: Dict[str, dict] = dataclasses.field(default_factory=dict)
    # coverage claims (verification/engine/claims.py): claim -> checked examples that
    # met it; claim -> why this run built no case to meet it
    claims_met: Dict[str, int] = dataclasses.field(default_factory=dict)
    claims_unmet: Dict[str, str] = dataclasses.field(default_factory=dict)
    # tensor -> why: tensors of checked examples the target could not be
    # compared on (registry.tensor_not_checkable_row), never passed
    tensors_not_checkable: Dict[str, str] = dataclasses.field(default_factory=dict)

    def met(self, names) -> None:
        """Count the claims one checked example met."""
        for name in names:
            self.claims_met[name] = self.claims_met.get(name, 0) + 1

    def add_deviation(self, tensor: str, ratio: float, examples: int = 1) -> None:
        _add_beyond(self.deviations, tensor, ratio, examples)

    def add_tolerated(self, tensor: str, ratio: float, examples: int = 1) -> None:
        _add_beyond(self.tolerated, tensor, ratio, examples)

    def add_failure(self, failure_class: str, ratio: float, examples: int = 1,
                    file: str = "", message: str = "",
                    shrunk: Optional[float] = None, diagnosis: Optional[dict] = None) -> None:
        c = self.classes.setdefault(failure_class, {"examples": 0, "worst": 0.0, "file": ""})
        c["examples"] += examples
        c["worst"] = max(c["worst"], ratio)
        c["file"] = file or c["file"]
        if message:
            c["message"] = message
        if shrunk is not None:
            c["shrunk"] = shrunk
        if diagnosis is not None:
            c["diagnosis"] = diagnosis

    @property
    def worst_class(self) -> Optional[str]:
        """The class of the worst failure (the summary's worst row is one of its)."""
        return max(self.classes, key=lambda k: self.classes[k]["worst"], default=None)

    @property
    def checked(self) -> int:
        """Examples whose check resolved the question (not those that raised)."""
        return max(0, self.examples - self.unresolved - self.raised)

    @property
    def nothing_checked(self) -> bool:
        """Some example could not be checked, and none was."""
        return bool(self.not_checkable) and not self.checked


@dataclasses.dataclass
class Session:
    """One run's state, owned by the plugin (one per pytest session):
    how verdicts are reached, and what the properties' tests found.

    options:      strict / known failures (RunOptions)
    stats:        property id -> PropertyStats (the summary's rows)
    last_failure: (property id, failure class) -> (case, target, rows) of
                  the latest failing example of that class (after shrinking:
                  the minimal one), for its counterexample file
    known_hits:   property id -> labels of the known failures that failed
    planned:      property id -> the examples its run plans (pinned cases
                  and the drawn budget; shrinking may add more)
    progress:     called after each example of a property's test with
                  (property id, its stats, planned), or None (the plugin
                  sets it where it can write to the terminal)
    announce:     writes one line where the user sees it (past pytest's
                  capture), or None: standard error
    """
    options: RunOptions = dataclasses.field(default_factory=RunOptions)
    stats: Dict[str, PropertyStats] = dataclasses.field(default_factory=dict)
    last_failure: Dict[str, tuple] = dataclasses.field(default_factory=dict)
    known_hits: Dict[str, set] = dataclasses.field(default_factory=dict)
    planned: Dict[str, int] = dataclasses.field(default_factory=dict)
    progress: Optional[Callable[[str, "PropertyStats", int], None]] = None
    announce: Optional[Callable[[str], None]] = None


_CURRENT = [Session()]


def session() -> Session:
    """The session the checks of this process record into."""
    return _CURRENT[0]


def begin_session(new: Session) -> Session:
    """Make `new` the current session (the plugin, at configure time)."""
    _CURRENT[0] = new
    return new


def _add_reason(stats: PropertyStats, reason: str) -> None:
    stats.not_checkable += 1
    stats.reasons[reason] = stats.reasons.get(reason, 0) + 1


def check_property(name: str, target, case, record: bool = True,
                   stats: Optional[PropertyStats] = None) -> List[TensorError]:
    """Run one property on one case, recording statistics (record=False: the
    meta-tests' runs on wrong targets stay out of the summary, and the
    known-failures file does not apply); on failure keep (case, target,
    rows) as the property's latest failing example (after shrinking,
    Hypothesis replays the minimal one last). A case the target does not
    declare support for is not run: in a property's test (record) it is
    rejected, Hypothesis drawing another; else it is one not-checkable row.
    stats: where an unrecorded run counts (default: a throwaway)."""
    if record:
        stats = session().stats.setdefault(name, PropertyStats())
    elif stats is None:
        stats = PropertyStats()
    prop = load_all()[name]
    reason = prop.not_checkable(target, case)
    if reason:
        _add_reason(stats, reason)
        if record:              # in a property's test: Hypothesis draws another case
            reject()
        return [not_checkable_row(name, reason)]
    c0, s0, t0 = runners.compile_count(), runners.compile_seconds(), time.perf_counter()
    try:
        with watchdog.instance().watching(functools.partial(_record_hang, name, case, target,
                                                            stats)):
            rows = mesh_worker.run(prop, target, case)
    except PropertyFailure as err:
        failing = [r for r in err.rows if not r.passed]
        covered = known_failures.covering(session().options.known, name, failing) if record else None
        compared = _compared(stats, err.rows)
        _update_worst(stats, compared)
        _count_beyond_bounds(stats, compared)
        if covered:
            stats.known_failures += 1
            session().known_hits.setdefault(name, set()).update(e.label for e in covered)
            return err.rows
        stats.failures += 1
        stats.first_failure_at = stats.first_failure_at or stats.examples + 1
        klass = failure_class(failing, getattr(case, "dtype", "?"))
        stats.add_failure(klass, max(r.ratio for r in failing))
        session().last_failure[(name, klass)] = (case, target, err.rows)
        raise classed(err, klass) from None
    except Exception as err:
        stats.failures += 1
        stats.raised += 1
        stats.first_failure_at = stats.first_failure_at or stats.examples + 1
        klass = raised_class(err)
        stats.add_failure(klass, math.inf, message=raised_message(err))
        session().last_failure[(name, klass)] = (case, target, [])
        raise
    finally:
        runners.release_executables_if_needed()
        stats.examples += 1
        stats.mixer_examples += isinstance(case, MixerCase)
        stats.seconds += time.perf_counter() - t0
        stats.compiles += runners.compile_count() - c0
        stats.compile_s += runners.compile_seconds() - s0
        if record and session().progress is not None:
            session().progress(name, stats, session().planned.get(name, 0))
    compared = _compared(stats, rows)
    _update_worst(stats, compared)
    _count_beyond_bounds(stats, compared)
    unresolved = [r for r in compared if is_not_checkable(r)]
    if unresolved:
        stats.unresolved += 1
        _add_reason(stats, unresolved[0].note.split(";")[0].split(": ", 1)[-1])
    else:
        stats.met(claims.claims_met(claims.claims_of(prop, lattice.current_covering()), case))
    return rows


def _record_hang(name: str, case, target, stats: PropertyStats, stalled_s: float) -> None:
    """The watchdog's handler (its thread; the process ends after it): the
    example as failure class watchdog.HUNG, its counterexample file with
    the stacks of every thread beside it, a line where the user sees it,
    and, in a pytest-xdist worker, a record the controller adopts."""
    from . import counterexamples
    from .profiles import selected_profile
    stats.examples += 1
    stats.raised += 1
    stats.failures += 1
    stats.first_failure_at = stats.first_failure_at or stats.examples
    stats.verdict = FAILED
    message = (f"no example finished in {stalled_s:.0f} s and the process sat idle "
               f"(under {watchdog.IDLE_CPU:.0%} of a core)")
    threads, cause = watchdog.stacks_and_cause()
    message += f": {cause}" if cause else ""
    path = counterexamples.write(name, case, target.spec, selected_profile(), [], message,
                                 failure_class=watchdog.HUNG)
    stacks = os.path.splitext(path)[0] + ".stacks.txt"
    with open(stacks, "w") as f:
        f.write(f"{name} on {target.spec}: {message}\n\n{threads}")
    stats.add_failure(watchdog.HUNG, math.inf, file=path, message=f"{message}; stacks: {stacks}")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    records = os.environ.get(watchdog.RECORDS_ENV)
    if worker and records:
        nodeid = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        with open(os.path.join(records, f"{worker}-{os.getpid()}.json"), "w") as f:
            json.dump({"nodeid": nodeid, "stats": stats_json({name: stats})}, f)
    text = (f"{name}: FAILED [{watchdog.HUNG}]: {message}; counterexample {path}; stacks "
            f"{stacks}; this process ends" + ("" if worker else
                                            " (a run without workers stops here)"))
    if session().announce is not None:
        session().announce(text)
    else:
        sys.stderr.write(f"gdn-verify: {text}\n")
        sys.stderr.flush()


def _compared(stats: PropertyStats, rows: List[TensorError]) -> List[TensorError]:
    """The rows that compared a tensor; the tensors not checkable on this
    target (registry.tensor_not_checkable_row) recorded in stats."""
    stats.tensors_not_checkable.update(
        (r.name, r.note.split(": ", 1)[1]) for r in rows if is_tensor_not_checkable(r))
    return [r for r in rows if not is_tensor_not_checkable(r)]


def _count_beyond_bounds(stats: PropertyStats, rows: List[TensorError]) -> None:
    """One example's deviation rows and rows held at the declared tolerance,
    one count per tensor."""
    for field, add in (("deviation", stats.add_deviation), ("tolerated", stats.add_tolerated)):
        beyond = {}
        for r in rows:
            if getattr(r, field):
                beyond[tensor_of(r)] = max(beyond.get(tensor_of(r), 0.0), getattr(r, field))
        for tensor, ratio in beyond.items():
            add(tensor, ratio)


def _update_worst(stats: PropertyStats, rows: List[TensorError]) -> None:
    """The worst ratio per tensor over the rows that checked it (a row that
    could not check its tensor, registry.is_not_checkable, is no ratio of
    the target's: counted under the property's reasons, never its worst)."""
    for r in rows:
        if is_not_checkable(r):
            continue
        best = stats.worst.get(r.name)
        if best is None or r.ratio > best.ratio:
            stats.worst[r.name] = r


def examples(weight: float, claim_cases: int = 0):
    """A settings decorator scaling the profile's max_examples by `weight`:
    cheap properties (no compile per example) run more examples, the ones
    that run the target several times per example run fewer. claim_cases:
    how many of the budget the property's claim cases take (in the
    profiles.CLAIM_CASES_IN_BUDGET); the drawn examples fill the rest, one
    at least."""
    base = settings().max_examples
    return settings(max_examples=max(1, int(round(base * weight)) - claim_cases))


def reasons_text(stats: PropertyStats) -> str:
    return "; ".join(f"{why} ({n} example{'s' if n > 1 else ''})"
                     for why, n in sorted(stats.reasons.items(), key=lambda kv: -kv[1]))


def tensors_not_checkable_text(stats: PropertyStats) -> str:
    return "; ".join(f"{name} ({why})" for name, why in sorted(stats.tensors_not_checkable.items()))


def conclude_test(p: Property, stats: PropertyStats) -> None:
    """The pytest outcome of a property's test once its examples ran without
    an unknown failure: skip (not checkable), fail (--gdn-strict with any
    example not checkable; a stale known failure), xfail, or pass."""
    run = session()
    listed = {e.label for e in run.options.known if e.property == p.id}
    stale = sorted(listed - run.known_hits.get(p.id, set()))
    if stale:
        stats.verdict = XPASS
        pytest.fail(f"[XPASS(strict)] {p.id}: known failure(s) {stale} did not fail in "
                    f"{stats.examples} example(s): remove them from the known-failures file",
                    pytrace=False)
    if run.options.strict and stats.tensors_not_checkable:
        pytest.fail(f"--gdn-strict: {p.id}: tensors {NOT_CHECKABLE}: "
                    f"{tensors_not_checkable_text(stats)}", pytrace=False)
    if stats.not_checkable and (run.options.strict or stats.nothing_checked):
        stats.verdict = NOT_CHECKABLE
        message = f"{NOT_CHECKABLE}: {reasons_text(stats)}"
        if run.options.strict:
            pytest.fail(f"--gdn-strict: {p.id}: {message}", pytrace=False)
        if not stats.known_failures:
            pytest.skip(message)
    if stats.known_failures:
        stats.verdict = XFAIL
        pytest.xfail(f"known failure(s) {sorted(run.known_hits[p.id])}: "
                     f"{stats.known_failures} example(s)")
    stats.verdict = HELD


class PropertyFailures(AssertionError):
    """Several failures of a property's run (its pinned cases', its drawn
    examples'): each was recorded with its class and counterexample file."""

    def __init__(self, prop: str, failures: List[BaseException]):
        self.failures = failures
        super().__init__(f"{prop}: {len(failures)} failures, each its own finding:\n\n"
                         + "\n\n".join(f"[{i + 1}] {type(f).__name__}: {f}"
                                       for i, f in enumerate(failures)))


def run_pinned(p: Property, target, cases, stats: PropertyStats,
               stop_at_first: bool) -> List[BaseException]:
    """Every pinned case of p (its explicit examples, then its claim cases)
    the target takes, each checked and recorded as a drawn example is (a
    failure's class and its case for its counterexample file); a failure
    never stops the next (stop_at_first: the kill profile's one failing
    example is enough). Returns the failures."""
    failures = []
    for case in cases:
        reason = p.not_checkable(target, case)
        if reason:
            _add_reason(stats, reason)
            continue
        try:
            check_property(p.id, target, case)
        except Exception as err:                 # pytest's skip/xfail/fail pass through
            if hasattr(err, "add_note"):
                err.add_note(f"pinned case: {case!r}")
            failures.append(err)
            if stop_at_first:
                break
    return failures


def hypothesis_test(p: Property):
    """The pytest test of one property: its pinned cases first (its
    explicit examples, then its claim cases, verification/engine/claims.py: the
    fewest cases the target takes that meet every coverage claim the
    explicit ones do not), every one run whatever the others found; then its
    strategy's within its share of the profile's example budget (a case the
    target cannot take is rejected: Hypothesis draws another). Each failure
    class is recorded and reported; one finding never masks another. Marked
    gdn_property(<id>) for selection by id (--gdn-properties).

    Declared a Hypothesis test (Hypothesis's own mark of its tests,
    `is_hypothesis_test`): its pytest plugin marks it `hypothesis` (so
    `-m hypothesis` selects the properties), and the test's one @given run
    reports its statistics, the strategies' events included, to that plugin
    (`--hypothesis-show-statistics`, the JUnit report) and its reports to the
    test's own "Hypothesis" section. The pinned cases run before that run,
    not as @example cases: Hypothesis raises an explicit example's failure
    before it draws, and one finding must never mask another."""
    # Hypothesis derives a test's database key, and the derandomized
    # profiles their examples, from its source, name and signature: this
    # function is kept as it was (the ci profile draws the examples it drew,
    # and each mutant meets the examples that killed it). The generated tests
    # share one source, so the property id is added to the key.
    def test(gdn_target, case):
        check_property(p.id, gdn_target, case)

    test.__name__ = test.__qualname__ = f"test_{p.id}"
    test._hypothesis_internal_add_digest = p.id.encode()

    def property_test(gdn_target):
        stats = session().stats.setdefault(p.id, PropertyStats())
        reason = p.not_checkable(gdn_target)
        if reason:
            _add_reason(stats, reason)
        else:
            plan = claims.plan(p, gdn_target)
            stats.claims_unmet.update(plan.unmet)
            phases = settings().phases
            # a profile without shrinking (kill) stops at its first failing example
            stop_at_first = Phase.shrink not in phases
            charged = (len(plan.cases) if lattice.suite_profile(
                settings.get_current_profile_name()) in CLAIM_CASES_IN_BUDGET else 0)
            budget = examples(p.weight, charged)
            session().planned[p.id] = ((len(p.examples) + len(plan.cases)
                                        if Phase.explicit in phases else 0) + budget.max_examples)
            failures = (run_pinned(p, gdn_target, p.examples + plan.cases, stats, stop_at_first)
                        if Phase.explicit in phases else [])
            if not (failures and stop_at_first):
                given_test = budget(given(case=p.strategy)(test))
                try:
                    given_test(gdn_target)
                except Unsatisfiable:
                    pass                            # every drawn case was not checkable
                except Exception as err:            # pytest's skip/xfail/fail pass through
                    failures.append(err)
            if not stats.examples and not stats.not_checkable:     # never a pass
                _add_reason(stats, NO_CASE_WITHIN_LIMITS if gdn_target.declaration.limits.declared
                            else "no case could be drawn")
            if failures:
                stats.verdict = FAILED
                if len(failures) == 1:
                    raise failures[0]
                raise PropertyFailures(p.id, failures)
        conclude_test(p, stats)

    property_test.__name__ = property_test.__qualname__ = f"test_{p.id}"
    property_test.__doc__ = p.doc
    property_test.is_hypothesis_test = True
    return getattr(pytest.mark, MARKER)(p.id)(property_test)


def verdict_of(p: Property, target, cases) -> Tuple[str, PropertyStats]:
    """The verdict of p on target over these cases, as the generated test
    would reach it (for meta-tests): (verdict, stats). Nothing is recorded."""
    stats = PropertyStats()
    reason = p.not_checkable(target)
    if reason:
        _add_reason(stats, reason)
        return NOT_CHECKABLE, stats
    for case in cases:
        try:
            check_property(p.id, target, case, record=False, stats=stats)
        except PropertyFailure:
            return FAILED, stats
    return (NOT_CHECKABLE if stats.nothing_checked else HELD), stats


def stats_json(stats: Optional[Dict[str, PropertyStats]] = None) -> dict:
    """Per-property statistics as plain JSON (for the mutation runner, and
    from pytest-xdist workers to the controller): counts, verdict, reasons
    not checkable, and the worst row of each tensor."""
    return {name: {"examples": st.examples, "failures": st.failures,
                   "first_failure_at": st.first_failure_at, "seconds": st.seconds,
                   "compiles": st.compiles, "compile_s": st.compile_s,
                   "not_checkable": st.not_checkable, "unresolved": st.unresolved,
                   "raised": st.raised,
                   "known_failures": st.known_failures, "verdict": st.verdict,
                   "mixer_examples": st.mixer_examples,
                   "reasons": dict(st.reasons),
                   "worst": [dataclasses.asdict(r) for r in st.worst.values()],
                   "classes": {k: dict(c) for k, c in st.classes.items()},
                   "deviations": {k: dict(d) for k, d in st.deviations.items()},
                   "tolerated": {k: dict(d) for k, d in st.tolerated.items()},
                   "claims_met": dict(st.claims_met), "claims_unmet": dict(st.claims_unmet),
                   "tensors_not_checkable": dict(st.tensors_not_checkable)}
            for name, st in (session().stats if stats is None else stats).items()}


def merge_stats_json(stats: dict, into: Optional[Dict[str, PropertyStats]] = None) -> None:
    """Add one process's stats_json() into `into` (default: this process's
    session's stats); a property whose examples ran in several processes sums its
    counts and keeps the worst rows (and the worse verdict)."""
    into = session().stats if into is None else into
    order = ("", HELD, NOT_CHECKABLE, XFAIL, XPASS, FAILED)
    for name, d in stats.items():
        st = into.setdefault(name, PropertyStats())
        if d["first_failure_at"] and not st.first_failure_at:
            st.first_failure_at = st.examples + d["first_failure_at"]
        st.examples += d["examples"]
        st.failures += d["failures"]
        st.seconds += d["seconds"]
        st.compiles += d["compiles"]
        st.compile_s += d.get("compile_s", 0.0)
        st.not_checkable += d["not_checkable"]
        st.unresolved += d.get("unresolved", 0)
        st.raised += d.get("raised", 0)
        st.known_failures += d.get("known_failures", 0)
        st.mixer_examples += d.get("mixer_examples", 0)
        for why, n in d.get("reasons", {}).items():
            st.reasons[why] = st.reasons.get(why, 0) + n
        verdict = d.get("verdict", "")
        if order.index(verdict if verdict in order else "") > order.index(st.verdict):
            st.verdict = verdict
        _update_worst(st, [TensorError(**r) for r in d.get("worst", ())])
        for tensor, dev in d.get("deviations", {}).items():
            st.add_deviation(tensor, dev["worst"], dev["examples"])
        for tensor, tol in d.get("tolerated", {}).items():
            st.add_tolerated(tensor, tol["worst"], tol["examples"])
        for klass, c in d.get("classes", {}).items():
            st.add_failure(klass, c["worst"], c["examples"], c["file"], c.get("message", ""),
                           c.get("shrunk"), c.get("diagnosis"))
        for claim, n in d.get("claims_met", {}).items():
            st.claims_met[claim] = st.claims_met.get(claim, 0) + n
        st.claims_unmet.update(d.get("claims_unmet", {}))
        st.tensors_not_checkable.update(d.get("tensors_not_checkable", {}))
