"""What one change to a failing case makes it pass: a failure's cause told
in the contract's terms.

After a property's failures are shrunk, each failure class's counterexample
is rerun with one factor changed at a time (FACTORS: ordinary gates and
beta, no near-zero q/k rows, independent keys, the default scale, no
initial state, float32 inputs, one head group, B = 1, one chunk), each only
where the case has it and the target takes the changed case. The
diagnosis lists the changes under which the case passes ("passes with
ordinary gates"), those under which it still fails, and those that could
not be tried (outside the target's declaration, or the check raised).
Failure classes of one property with the same changes that pass are one
cause (`causes`, read by the summary and the picture). Factors the case cannot express (the
incoming conv state, the cotangents of the outputs and of the returned
state) are not among them: a diagnosis says so where it finds nothing.

Bounded: at most BUDGET_S seconds per failure class; what is left untried
is listed. The profiles without shrinking (kill) diagnose nothing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Tuple

from strategies.cases import DeltaRuleCase, MixerCase

from .registry import PropertyFailure, is_not_checkable

BUDGET_S = 30.0
NOT_EXPRESSED = ("the incoming conv state", "the output's and the returned state's cotangents")


def _batch_axis_one(shape: Tuple[int, ...], batch: int) -> Tuple[int, ...]:
    """A parameter shape ([Hv], [B', Hv] or [B', T', Hv]) at B = 1."""
    return (1,) + shape[1:] if len(shape) >= 2 and shape[0] == batch else shape


def _time_axis(shape: Tuple[int, ...], seq_len: int, new: int) -> Tuple[int, ...]:
    return shape[:1] + (new,) + shape[2:] if len(shape) == 3 and shape[1] == seq_len else shape


def _one_batch_row(case):
    rows = dict(batch=1, segments=case.segments[:1])
    if isinstance(case, MixerCase):
        rows.update(near_zero=tuple(r for r in case.near_zero if r.batch == 0),
                    a_log_shape=_batch_axis_one(case.a_log_shape, case.batch),
                    dt_bias_shape=_batch_axis_one(case.dt_bias_shape, case.batch))
    else:
        rows.update(zero_rows=tuple(r for r in case.zero_rows if r[1] == 0))
    return dataclasses.replace(case, **rows)


def _one_chunk(case):
    t = case.chunk
    fields = dict(seq_len=t)
    if isinstance(case, MixerCase):
        fields.update(near_zero=tuple(r for r in case.near_zero if r.token < t),
                      a_log_shape=_time_axis(case.a_log_shape, case.seq_len, t),
                      dt_bias_shape=_time_axis(case.dt_bias_shape, case.seq_len, t))
    else:
        fields.update(zero_rows=tuple(r for r in case.zero_rows if r[2] < t))
    return dataclasses.replace(case, **fields)


def _one_group(case):
    """G = 1: one value head per key head (the parameters' head axis too)."""
    fields = dict(group=1)
    if isinstance(case, MixerCase):
        fields.update(a_log_shape=case.a_log_shape[:-1] + (case.k_heads,),
                      dt_bias_shape=case.dt_bias_shape[:-1] + (case.k_heads,))
    return dataclasses.replace(case, **fields)


def _float32(case):
    if isinstance(case, MixerCase):
        return dataclasses.replace(case, dtype="float32", param_dtype="float32")
    return dataclasses.replace(case, dtype="float32", state_dtype="float32")


def _no_small_rows(case):
    if isinstance(case, MixerCase):
        return dataclasses.replace(case, near_zero=())
    return dataclasses.replace(case, zero_rows=())


def _has_small_rows(case) -> bool:
    return bool(case.near_zero if isinstance(case, MixerCase) else case.zero_rows)


@dataclasses.dataclass(frozen=True)
class Factor:
    """One change: `name` says what the changed case has; applies(case):
    whether the case has something to change; change(case): the case
    changed (cheap changes first in FACTORS: no new program)."""
    name: str
    applies: Callable
    change: Callable


FACTORS = (
    Factor("ordinary gates", lambda c: c.gate_regime != "ordinary",
           lambda c: dataclasses.replace(c, gate_regime="ordinary")),
    Factor("ordinary beta (away from 0 and 1)", lambda c: c.beta_regime != "ordinary",
           lambda c: dataclasses.replace(c, beta_regime="ordinary")),
    Factor("no near-zero q/k rows", _has_small_rows, _no_small_rows),
    Factor("independent keys", lambda c: isinstance(c, DeltaRuleCase) and bool(
        c.key_cosine or c.key_pair_cosine),
        lambda c: dataclasses.replace(c, key_cosine=0.0, key_pair_cosine=0.0)),
    Factor("the default scale", lambda c: c.scale is not None,
           lambda c: dataclasses.replace(c, scale=None)),
    Factor("no initial state", lambda c: isinstance(c, DeltaRuleCase) and c.has_initial_state,
           lambda c: dataclasses.replace(c, has_initial_state=False)),
    Factor("float32 inputs", lambda c: c.dtype != "float32", _float32),
    Factor("one head group (G = 1)", lambda c: c.group > 1, _one_group),
    Factor("B = 1", lambda c: c.batch > 1 and not c.segments, _one_batch_row),
    Factor("one chunk", lambda c: c.seq_len > c.chunk and not c.segments, _one_chunk),
)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """passes_with: the changes under which the case passes; fails_with:
    those under which it still fails; untried: (change, why) of those not
    run (the target does not take the changed case, the check raised, or
    the time bound)."""
    passes_with: Tuple[str, ...]
    fails_with: Tuple[str, ...]
    untried: Tuple[Tuple[str, str], ...]

    @property
    def cause(self) -> str:
        """One line: what the failure needs, as far as the changes tell."""
        if self.passes_with:
            text = "passes with " + " or ".join(self.passes_with) + " (one change each)"
        elif self.fails_with:
            text = (f"fails under each of the {len(self.fails_with)} changes tried (the cause "
                    f"is none of them; not expressed: {', '.join(NOT_EXPRESSED)})")
        else:
            text = "no change applies to this case"
        if self.untried:
            text += "; partial: not tried: " + ", ".join(name for name, _ in self.untried)
        return text

    def to_json(self) -> dict:
        return {"cause": self.cause, "passes_with": list(self.passes_with),
                "fails_with": list(self.fails_with),
                "untried": [list(u) for u in self.untried]}


def _verdict(check: Callable, case) -> Tuple[Optional[bool], str]:
    """(True: passes, False: fails, None: could not be tried, why)."""
    try:
        rows = check(case)
    except PropertyFailure:
        return False, ""
    except Exception as err:           # the target, or the check, raised on the changed case
        return None, f"raised {type(err).__name__}"
    blocked = [r for r in rows if is_not_checkable(r)]
    if blocked:
        return None, blocked[0].note
    return True, ""


def diagnose(check: Callable, case, budget_s: float = BUDGET_S,
             clock=time.monotonic) -> Diagnosis:
    """The diagnosis of one failing case; check(case) -> rows, raising a
    PropertyFailure where the case fails (harness.check_property, recording
    nothing)."""
    start = clock()
    passes, fails, untried = [], [], []
    for factor in FACTORS:
        if not factor.applies(case):
            continue
        if clock() - start > budget_s:
            untried.append((factor.name, f"the {budget_s:.0f} s bound"))
            continue
        verdict, why = _verdict(check, factor.change(case))
        if verdict is None:
            untried.append((factor.name, why))
        else:
            (passes if verdict else fails).append(factor.name)
    return Diagnosis(tuple(passes), tuple(fails), tuple(untried))


def causes(classes: dict) -> dict:
    """A property's failure classes (harness.PropertyStats.classes, or their
    JSON) by cause: the changes that make the case pass -> its classes, the
    worst first; a class without a diagnosis, or whose changes found
    nothing, under a cause of its own."""
    groups: dict = {}
    for k in sorted(classes, key=lambda k: -classes[k]["worst"]):
        found = classes[k].get("diagnosis") or {}
        key = tuple(found.get("passes_with") or ()) or ("", k)
        groups.setdefault(key, []).append(k)
    return groups

