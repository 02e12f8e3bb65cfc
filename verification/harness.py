"""Glue between the registered properties and pytest/Hypothesis: the test
generated for each property, per-property statistics for the summary, and
the last failing case of each property for the counterexample file."""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

import pytest
from hypothesis import example, given, settings

from . import runners
from .registry import Property, PropertyFailure, load_all
from .tolerance import NOT_CHECKABLE, TensorError

MARKER = "gdn_property"


@dataclasses.dataclass
class PropertyStats:
    examples: int = 0
    failures: int = 0
    seconds: float = 0.0
    compiles: int = 0
    compile_s: float = 0.0        # of seconds: tracing, lowering and compiling new programs
    first_failure_at: int = 0     # 1-based example index of the first failure
    not_checkable: int = 0        # examples whose check could not resolve the question
    worst: Dict[str, TensorError] = dataclasses.field(default_factory=dict)


STATS: Dict[str, PropertyStats] = {}
LAST_FAILURE: Dict[str, tuple] = {}


def check_property(name: str, target, case, record: bool = True) -> List[TensorError]:
    """Run one property on one case, recording statistics (record=False: the
    meta-tests' runs on wrong targets stay out of the summary); on failure
    keep (case, target, rows) as the property's latest failing example (after
    shrinking, Hypothesis replays the minimal one last)."""
    stats = STATS.setdefault(name, PropertyStats()) if record else PropertyStats()
    c0, s0, t0 = runners.compile_count(), runners.compile_seconds(), time.perf_counter()
    try:
        rows = load_all()[name].run(target, case)
    except PropertyFailure as err:
        stats.failures += 1
        stats.first_failure_at = stats.first_failure_at or stats.examples + 1
        LAST_FAILURE[name] = (case, target, err.rows)
        _update_worst(stats, err.rows)
        raise
    except Exception:
        stats.failures += 1
        stats.first_failure_at = stats.first_failure_at or stats.examples + 1
        LAST_FAILURE[name] = (case, target, [])
        raise
    finally:
        runners.release_executables_if_needed()
        stats.examples += 1
        stats.seconds += time.perf_counter() - t0
        stats.compiles += runners.compile_count() - c0
        stats.compile_s += runners.compile_seconds() - s0
    _update_worst(stats, rows)
    stats.not_checkable += any(r.note.startswith(NOT_CHECKABLE) for r in rows)
    return rows


def _update_worst(stats: PropertyStats, rows: List[TensorError]) -> None:
    for r in rows:
        best = stats.worst.get(r.name)
        if best is None or r.ratio > best.ratio:
            stats.worst[r.name] = r


def examples(weight: float):
    """A settings decorator scaling the profile's max_examples by `weight`:
    cheap properties (no compile per example) run more examples, the ones
    that run the target several times per example run fewer."""
    base = settings().max_examples
    return settings(max_examples=max(1, int(round(base * weight))))


def hypothesis_test(p: Property):
    """The pytest test of one property: @given its strategy, its explicit
    examples first, its share of the profile's example budget, marked
    gdn_property(<id>) for selection by id (--gdn-properties)."""
    def test(gdn_target, case):
        check_property(p.id, gdn_target, case)

    test.__name__ = test.__qualname__ = f"test_{p.id}"
    test.__doc__ = p.doc
    # Hypothesis keys its example database by the test's source: the
    # generated tests share one, so the property id is added to the key.
    test._hypothesis_internal_add_digest = p.id.encode()
    wrapped = given(case=p.strategy)(test)
    for case in reversed(p.examples):
        wrapped = example(case=case)(wrapped)
    return getattr(pytest.mark, MARKER)(p.id)(examples(p.weight)(wrapped))


def stats_json(stats: Optional[Dict[str, PropertyStats]] = None) -> dict:
    """Per-property statistics as plain JSON (for the mutation runner, and
    from pytest-xdist workers to the controller): counts, and the worst row
    of each tensor."""
    return {name: {"examples": st.examples, "failures": st.failures,
                   "first_failure_at": st.first_failure_at, "seconds": st.seconds,
                   "compiles": st.compiles, "compile_s": st.compile_s, "not_checkable": st.not_checkable,
                   "worst": [dataclasses.asdict(r) for r in st.worst.values()]}
            for name, st in (STATS if stats is None else stats).items()}


def merge_stats_json(stats: dict, into: Optional[Dict[str, PropertyStats]] = None) -> None:
    """Add one process's stats_json() into `into` (default: this process's
    STATS); a property whose examples ran in several processes sums its
    counts and keeps the worst rows."""
    into = STATS if into is None else into
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
        _update_worst(st, [TensorError(**r) for r in d.get("worst", ())])
