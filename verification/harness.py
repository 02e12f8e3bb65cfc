"""Glue between the property functions and pytest/Hypothesis: per-property
statistics for the summary, and the last failing case of each property for
the counterexample file."""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

from hypothesis import settings

from . import runners
from .properties import PROPERTIES, PropertyFailure
from .tolerance import TensorError


@dataclasses.dataclass
class PropertyStats:
    examples: int = 0
    failures: int = 0
    seconds: float = 0.0
    compiles: int = 0
    first_failure_at: int = 0     # 1-based example index of the first failure
    worst: Dict[str, TensorError] = dataclasses.field(default_factory=dict)


STATS: Dict[str, PropertyStats] = {}
LAST_FAILURE: Dict[str, tuple] = {}


def check_property(name: str, target, case, record: bool = True) -> List[TensorError]:
    """Run one property on one case, recording statistics (record=False: the
    meta-tests' runs on wrong targets stay out of the summary); on failure
    keep (case, target, rows) as the property's latest failing example (after
    shrinking, Hypothesis replays the minimal one last)."""
    stats = STATS.setdefault(name, PropertyStats()) if record else PropertyStats()
    c0, t0 = runners.compile_count(), time.perf_counter()
    try:
        rows = PROPERTIES[name].check(target, case)
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
    _update_worst(stats, rows)
    return rows


def _update_worst(stats: PropertyStats, rows: List[TensorError]) -> None:
    for r in rows:
        best = stats.worst.get(r.name)
        if best is None or r.ratio > best.ratio:
            stats.worst[r.name] = r


def pop_failure(name: str) -> Optional[tuple]:
    return LAST_FAILURE.pop(name, None)


def examples(weight: float):
    """A settings decorator scaling the profile's max_examples by `weight`:
    cheap properties (no compile per example) run more examples, the ones
    that run the target several times per example run fewer."""
    base = settings().max_examples
    return settings(max_examples=max(1, int(round(base * weight))))


def stats_json() -> dict:
    """Per-property statistics as plain JSON (for the mutation runner)."""
    return {name: {"examples": st.examples, "failures": st.failures,
                   "first_failure_at": st.first_failure_at, "seconds": st.seconds,
                   "compiles": st.compiles}
            for name, st in STATS.items()}
