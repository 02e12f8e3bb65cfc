"""The property registry: each property of the suite is declared once, beside
its check function, with everything the runners need.

    @prop("mixer_forward_parity", family="parity", strategy=mixer_cases(),
          wrong_target="gdn_mutant_beta_applied_twice:xla",
          covers={"bfloat16": lambda c: c.dtype == "bfloat16"})
    def mixer_forward_parity(target, case):
        '''gdn_decoupled_conv1d output matches the float64 oracle.'''
        return [...rows...]

A check is a plain function `check(target, case) -> rows` (TensorError rows,
verification.tolerance); it knows nothing of pytest or Hypothesis, so
`gdn-verify replay` reruns exactly the same check on a stored case. The
pytest tests are generated from this registry (verification/engine/harness.py,
verification/tests/test_properties.py); the mutation runner, the benchmarks and
the meta-tests select properties by id, never by a test-function name.
`verification.properties.load_all()` registers every family; a check runs
through `verification.engine.mesh_worker.run` (in this process or a mesh worker).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from hypothesis import strategies as st
from hypothesis import target as hypothesis_target

from ..targets.declaration import case_needs, case_type_needs, check_needs
from ..tolerance import NOT_CHECKABLE, TensorError, format_table, worst

FAMILIES = ("parity", "eps", "reduced_gradients", "metamorphic", "packing", "state", "sharding",
            "stability", "bad_input", "conventions")


class PropertyFailure(AssertionError):
    """A property does not hold; .rows holds the error table, .failure_class
    the class of the failure once classed (tolerance.failure_class)."""
    failure_class = ""

    def __init__(self, prop: str, rows: List[TensorError], message: str = ""):
        self.prop, self.rows = prop, rows
        super().__init__(f"{prop} failed{': ' + message if message else ''}\n"
                         + format_table(rows))

    def __reduce__(self):           # a classed failure's type is made at run time
        return _rebuild_failure, (self.failure_class, self.prop, self.rows, self.args)


_FAILURE_TYPES: Dict[str, type] = {}


def failure_type(failure_class: str) -> type:
    """The PropertyFailure subclass of one failure class, made once per
    process: Hypothesis tells failures apart by their exception type (its
    InterestingOrigin), so failures of different classes are shrunk and
    reported separately."""
    if not failure_class:
        return PropertyFailure
    cls = _FAILURE_TYPES.get(failure_class)
    if cls is None:
        cls = _FAILURE_TYPES[failure_class] = type(
            f"PropertyFailure[{failure_class}]", (PropertyFailure,),
            {"failure_class": failure_class, "__module__": __name__})
    return cls


def _rebuild_failure(failure_class: str, prop: str, rows, args) -> PropertyFailure:
    err = failure_type(failure_class).__new__(failure_type(failure_class))
    err.prop, err.rows, err.args = prop, rows, args
    return err


def classed(err: PropertyFailure, failure_class: str) -> PropertyFailure:
    """err as a failure of its class (its message prefixed by the class)."""
    return _rebuild_failure(failure_class, err.prop, err.rows,
                            (f"[{failure_class}] {err.args[0]}",) + err.args[1:])


@dataclasses.dataclass(frozen=True)
class Property:
    """One registered property.

    id:           stable name (test name test_<id>, counterexample files,
                  mutant killers, --gdn-properties)
    family:       one of FAMILIES (the module it is declared in)
    check:        check(target, case) -> rows
    strategy:     the Hypothesis strategy of its cases
    weight:       example budget relative to the profile's max_examples
    wrong_target: a target spec this property must fail (meta-test)
    examples:     explicit cases run first in every profile (regressions)
    covers:       coverage claims: name -> predicate on a case; the
                  strategy must reach each (meta-test)
    gate_covers:  claims met only in the gate's profiles (the lattice's
                  "pairs" covering: ci, kill, nightly), e.g. the LONG rows
                  dev leaves out (meta-test in ci); the dev summary lists
                  them unmet with gate_only_why
    gate_only_why: why the dev loop leaves the gate_covers to the gate
                  (default: claims.GATE_ONLY, the rows dev's covering lacks)
    devices:      devices its check needs (a mesh); with fewer in this
                  process it runs in a mesh worker (verification/engine/mesh_worker.py)
    on_sharded_target: part of the declared subset `.ci/run` runs against
                  a sharded target (SHARDED_SUBSET)
    needs:        what the property asks of every target beyond what each
                  case asks (verification/targets/declaration.py NEEDS keys, or
                  "chunk_size:<n>"); unmet: the property is not checkable
    case_needs:   case -> what that case asks of the target (default: its
                  op, dtype, chunk size, GVA, packing, initial state)
    """
    id: str
    family: str
    check: Callable
    strategy: st.SearchStrategy
    weight: float
    wrong_target: str
    examples: Tuple = ()
    covers: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    gate_covers: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    gate_only_why: str = ""
    devices: int = 1
    on_sharded_target: bool = False
    needs: Tuple[str, ...] = ()
    case_needs: Callable = case_needs

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip().splitlines()[0]

    def needs_of_every_case(self) -> Tuple[str, ...]:
        """What every case of its strategy asks (its cases of one type, asking
        the default case_needs): a target lacking it takes none of them, so
        the property is not checkable there before any case is drawn (a
        layer-only target's core-op properties drew 2,000 candidates for
        their claims and then every example, each refused)."""
        case_type = getattr(self.strategy, "case_type", None)
        if case_type is None or self.case_needs is not case_needs:
            return ()
        return case_type_needs(case_type)

    def claim_not_checkable(self, target, predicate) -> Optional[str]:
        """Why the target takes no case meeting this claim of the property,
        read from its declaration alone (the needs the claim declares,
        claim() below, where its cases ask the default case_needs), or None:
        then only draws can tell."""
        needs = claim_needs(predicate)
        if not needs or self.case_needs is not case_needs:
            return None
        return target.not_checkable(needs)

    def not_checkable(self, target, case=None) -> Optional[str]:
        """Why this property cannot be checked on target (on this case: what
        it needs, and whether its shape is inside the target's declared
        limits), or None."""
        if case is None:
            return target.not_checkable(self.needs + self.needs_of_every_case())
        return (target.not_checkable(self.needs + self.case_needs(case))
                or target.declaration.limits.refuses_case(case))


def not_checkable_row(name: str, reason: str) -> TensorError:
    """The row of a check that could not be made: never a pass (harness)."""
    return TensorError(name, 0.0, 0.0, 0.0, 0.0, True, f"{NOT_CHECKABLE}: {reason}")


def is_not_checkable(row: TensorError) -> bool:
    return row.note.startswith(NOT_CHECKABLE)


TENSOR_NOT_CHECKABLE = "tensor not checkable"


def tensor_not_checkable_row(name: str, reason: str) -> TensorError:
    """The row of one tensor a check could not compare on this target while
    its other rows were compared (the example counts as checked): never a
    pass of that tensor; the summary lists it under its property."""
    return TensorError(name, 0.0, 0.0, 0.0, 0.0, True, f"{TENSOR_NOT_CHECKABLE}: {reason}")


def is_tensor_not_checkable(row: TensorError) -> bool:
    return row.note.startswith(TENSOR_NOT_CHECKABLE)


def claim(predicate: Callable, *needs: str) -> Callable:
    """A coverage claim whose every meeting case asks `needs` of a target
    (case needs: targets.declaration.case_needs' NEEDS keys, "dtype:<name>",
    "chunk_size:<n>", "qk_norm:<eps or off>"). On a target lacking one the
    claim is unmet by its declaration, with the reason, and no case is
    searched for it (verification/engine/claims.py); a meta-test checks the
    needs on every case of the run that meets the claim."""
    predicate.needs = tuple(needs)
    return predicate


def shape_claim(predicate: Callable, *needs: str) -> Callable:
    """A coverage claim a case meets or not by its shape alone (its lattice
    row: strategies.cases.SHAPE_FIELDS, e.g. T=1, C=128, a [B, Hv] a_log),
    with the needs of claim(). Where no shape the property's strategy draws
    on (inside the target's declared limits and supports) meets it, the
    claim is unmet, with the reason, without a search (verification/engine/
    claims.py); a meta-test checks that every case meeting it meets it by
    its shape."""
    claim(predicate, *needs)
    predicate.by_shape = True
    return predicate


def claim_needs(predicate) -> Tuple[str, ...]:
    """What every case meeting this claim asks of a target (claim's needs)."""
    return getattr(predicate, "needs", ())


def met_by_shape(predicate) -> bool:
    """The claim is met or not by a case's shape alone (shape_claim)."""
    return getattr(predicate, "by_shape", False)


PROPERTIES: Dict[str, Property] = {}


def prop(prop_id: str, *, family: str, strategy: st.SearchStrategy, wrong_target: str,
         weight: float = 1.0, examples: Tuple = (), covers: Mapping[str, Callable] = None,
         gate_covers: Mapping[str, Callable] = None, gate_only_why: str = "", devices: int = 1,
         on_sharded_target: bool = False, needs: Tuple[str, ...] = (),
         needs_of_case: Callable = case_needs):
    """Register the decorated check function as property `prop_id`."""
    if family not in FAMILIES:
        raise ValueError(f"property {prop_id}: unknown family {family!r}")
    check_needs([n for n in needs if ":" not in n])

    def deco(check):
        if prop_id in PROPERTIES:
            raise ValueError(f"property {prop_id} declared twice")
        PROPERTIES[prop_id] = Property(prop_id, family, check, strategy, weight,
                                       wrong_target, tuple(examples), dict(covers or {}),
                                       dict(gate_covers or {}), gate_only_why, devices,
                                       on_sharded_target,
                                       tuple(needs), needs_of_case)
        return check
    return deco


# --gdn-properties keyword: the properties declared on_sharded_target.
SHARDED_SUBSET = "sharded-subset"


def select(ids) -> List[Property]:
    """The properties named by ids (ValueError naming any unknown id)."""
    unknown = [i for i in ids if i not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown property id(s) {unknown}; registered: {sorted(PROPERTIES)}")
    return [PROPERTIES[i] for i in ids]


def conclude(prop_id: str, rows: List[TensorError], message: str = "") -> List[TensorError]:
    """Raise PropertyFailure if any row fails; feed the worst ratio to
    hypothesis.target() (nightly's search for the largest error)."""
    w = worst(rows)
    if w is not None and math.isfinite(w.ratio):
        try:
            hypothesis_target(float(w.ratio), label=f"{prop_id}: worst error / bound")
        except Exception:  # noqa: BLE001 - outside @given (replay, CLI)
            pass
    if any(not r.passed for r in rows):
        raise PropertyFailure(prop_id, rows, message)
    return rows

