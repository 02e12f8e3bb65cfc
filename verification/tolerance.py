"""The tolerance policy: one place, written down.

Every tensor is compared with the float64 oracle (the token scan with plain
autodiff, gdn_kernels.reference, on the same input values cast to float64)
by two numbers:
  rel_l2  = ||kernel - oracle||_2 / ||oracle||_2
  max_abs = max |kernel - oracle|
Each is bounded by RATIO times the error that the SAME-PRECISION REFERENCE
(the same token scan, run on the case's own dtypes) makes against the oracle,
with floors:
  bound_rel = max(RATIO * ref_rel_l2, rel_floor[dtype])
  bound_abs = max(RATIO * ref_max_abs, rel_floor[dtype] * max|oracle|,
                  abs_floor[dtype])
A tensor passes when max_abs <= bound_abs and either rel_l2 <= bound_rel or
the whole difference is below the absolute floor (a near-zero oracle tensor,
e.g. the gradient of an all-zero q row under strong decay, has no meaningful
relative error). A non-finite kernel value where the oracle is finite fails.

Why these numbers (measured, see README "Tolerance policy"):
- The token scan in float32 is 1e-7..3e-7 from the oracle; the chunked float32
  kernels 3e-7..2e-6 (the triangular inverse and the chunk-level state
  update reassociate sums). RATIO = 32 leaves headroom for that reassociation
  and nothing more: a deliberately broken inverse is 0.19 off, an eps
  mismatch on a near-zero row is off by orders of magnitude.
- rel_floor protects against a same-precision reference that is by chance
  almost exact: float32 2e-6 (the 95th-percentile chunked error), bfloat16
  8e-3 (two bf16 ulps at the output cast).
- abs_floor: float32 1e-6, bfloat16 4e-3 (absolute noise of a unit-scale
  tensor at the output cast).
Never loosen a number here to make a test pass: a red test is a finding.

Declared compute precision (PRECISIONS): a target may declare that it
computes its bfloat16-input cases below the contract's float32
(declaration.Supports.compute_precision). "Same precision" then follows
the declaration: the reference is the token scan under that precision's
written rounding model, and every kernel-vs-kernel bound is its dtype's
row. Each tensor is judged twice: at the declared precision (the verdict)
and at the contract's (float32 state and accumulation); a tensor within
the first but beyond the second passes as a DEVIATES row carrying its
ratio at the contract's bound, and the summary lists those rows apart.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Iterable, List, Mapping, Optional

import numpy as np

RATIO = 32.0


@dataclasses.dataclass(frozen=True)
class DtypeTolerance:
    """The bounds of one dtype (the dtype a tensor is produced in).

    rel_floor, abs_floor: floors of the oracle comparison (above).
    self_bound: kernel-vs-kernel comparisons (metamorphic properties:
        chunk-size and split invariance, causality, batch independence,
        GVA = repeat, broadcast sums): both sides carry the kernel's own
        rounding, so two kernel error budgets, 2 * RATIO * (float32
        token-scan error ~3e-7) ~ 2e-5; relative, and absolute times
        max(1, max|expected|).
    handoff: a call split into pieces with the carried state (GDNState)
        vs one call, same kernel (split invariance, prompt + decode): the
        pieces run the same math on the same inputs; only where the chunk
        grid falls (and the decode path's token steps) changes summation
        order. float32 2e-6 relative (docs/contract.md section 7, issue
        acceptance; measured worst ~2e-7); bfloat16 one output rounding.
        Not for parameter gradients summed over tokens (cancellation): those
        take self_bound (verification/properties/state.py).
    sharded: the ops over a device mesh (gdn_kernels.sharded) vs the same
        ops on one device: every shard runs the same kernels on its rows
        and heads; only XLA's per-shard fusion and the order in which
        shared-parameter gradients are summed over the batch shards
        change. float32 1e-6 relative (docs/contract.md section 8;
        measured worst 2.3e-7 on a per-row dx); bfloat16 one output
        rounding. Each corner shard is also compared, under the same bound,
        with the unsharded op run on that shard's rows and heads alone
        (gdn_kernels is bitwise there; the contract promises this bound).
    twin: gdn_kernels' Pallas kernels vs their XLA twin: the same chunk_math
        functions compiled differently by XLA:CPU (one chunk per grid step
        vs all chunks vmapped), so only summation-order differences of the
        matrix-vector dots (measured worst 2.6e-7, dg).
    contract_out, contract_grad: the contract's acceptance bounds for this
        project's kernels against the float64 oracle (relative L2):
        float32 1e-5 on outputs and the final state, 1e-4 on gradients;
        bfloat16 2e-2. Checked on the explicit cases
        (verification/tests/test_pallas_modes.py), not by the properties, whose
        bound is the same-precision reference's error times RATIO.
    """
    rel_floor: float
    abs_floor: float
    self_bound: float
    handoff: float
    sharded: float
    twin: float
    contract_out: float
    contract_grad: float


# The one table of dtypes and their tolerances (keys: strategies.inputs.DTYPES).
DTYPES = {
    "float32": DtypeTolerance(rel_floor=2e-6, abs_floor=1e-6, self_bound=2e-5, handoff=2e-6,
                              sharded=1e-6, twin=1e-6,
                              contract_out=1e-5, contract_grad=1e-4),
    "bfloat16": DtypeTolerance(rel_floor=8e-3, abs_floor=4e-3, self_bound=1.6e-2,
                               handoff=1.6e-2, sharded=1.6e-2, twin=1.6e-2, contract_out=2e-2, contract_grad=2e-2),
    "float64": DtypeTolerance(rel_floor=1e-12, abs_floor=1e-12, self_bound=1e-12,
                              handoff=1e-12, sharded=1e-12, twin=1e-12, contract_out=1e-12, contract_grad=1e-12),
}


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a target computes its bfloat16-input cases, and how the policy
    judges them.

    name:     the value of declaration.Supports.compute_precision
    products, state: the rounding model of its same-precision reference
              (the token scan, gdn_kernels.reference.Rounding): the dtype
              each product's operands and result are rounded to, and the
              dtype the state is rounded to after each update (None: not
              rounded)
    bounds:   the DTYPES row of every tensor's kernel-vs-kernel bounds
              (self, handoff, sharded) and of its oracle floors, whatever
              dtype the tensor is produced in
    model:    the rounding model, in words
    """
    name: str
    products: Optional[str]
    state: Optional[str]
    bounds: str
    model: str


CONTRACT_PRECISION = "float32"
PRECISIONS = {p.name: p for p in (
    Precision(CONTRACT_PRECISION, None, None, "float32",
              "the contract: bfloat16 inputs, float32 products, accumulation, gates, "
              "triangular inverse and state"),
    Precision("bfloat16", "bfloat16", None, "bfloat16",
              "bfloat16 compute, float32 state: every product of the recurrence (k.S, "
              "the rank-one update k (x) beta(v - k.S), q.S) takes bfloat16 operands and "
              "is rounded to bfloat16, cotangents likewise; gates and the state's "
              "accumulation stay float32"),
    Precision("bfloat16-state", "bfloat16", "bfloat16", "bfloat16",
              "bfloat16 throughout: as bfloat16, and the state is rounded to bfloat16 "
              "after every update"),
)}

_IN_FORCE: contextvars.ContextVar = contextvars.ContextVar("gdn_declared_precision",
                                                          default=None)


@contextlib.contextmanager
def declared_precision(name: str):
    """Judge the comparisons made inside at the declared precision `name`
    (a PRECISIONS key; the contract's: the contract alone). Set around one
    check of one case (verification.engine.mesh_worker)."""
    token = _IN_FORCE.set(None if name == CONTRACT_PRECISION else PRECISIONS[name])
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def precision_in_force() -> Optional[Precision]:
    """The declared precision the current check is judged at, or None (the
    contract)."""
    return _IN_FORCE.get()


@dataclasses.dataclass(frozen=True)
class TensorError:
    """One row of an error table. `ratio` is the number the verdict used:
    a passing numeric row has ratio <= 1, a failing one > 1 (exact and
    structural rows, whose bounds are 0, have ratio 0 or inf). deviation:
    for a row that passed only at the target's declared precision, its
    ratio at the contract's bound (note DEVIATES); else 0. tolerated: for
    a row that passed only at the author's declared tolerance (its bounds
    are the policy's times the declared factor), its ratio at the policy's
    bound (note TOLERATED); else 0."""
    name: str
    rel_l2: float
    max_abs: float
    bound_rel: float
    bound_abs: float
    passed: bool
    note: str = ""
    deviation: float = 0.0
    tolerated: float = 0.0

    @property
    def ratio(self) -> float:
        """Worst of rel/bound_rel and abs/bound_abs (1.0 = at the bound); a
        row that passed through the near-zero absolute floor is judged by
        its absolute error alone, and so is its ratio."""
        if self.bound_rel == 0 and self.bound_abs == 0:   # exact / structural rows
            return 0.0 if self.passed else math.inf
        r = self.rel_l2 / self.bound_rel if self.bound_rel else math.inf
        a = self.max_abs / self.bound_abs if self.bound_abs else math.inf
        return a if self.near_zero else max(r, a)

    @property
    def near_zero(self) -> bool:
        """Judged by the near-zero absolute floor (its relative error had no meaning)."""
        return self.note.startswith(NEAR_ZERO)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"ratio": self.ratio}


NEAR_ZERO = "near-zero"
NON_FINITE = "non-finite"
DEVIATES = "deviates from the contract"
TOLERATED = "held at the declared tolerance"
BEYOND_TOLERANCE = "beyond the declared tolerance"
# A row whose check could not resolve its question (its note starts so);
# it passes, and the summary counts it.
NOT_CHECKABLE = "not checkable"


def structural_row(name: str, ok: bool, note: str = "") -> TensorError:
    """A row with no numeric bound (shape, dtype, error type...)."""
    return TensorError(name, 0.0, 0.0, 0.0, 0.0, bool(ok), "" if ok else note)


def _as64(x) -> np.ndarray:
    return np.asarray(np.asarray(x).astype(np.float64))


def errors(kernel, oracle):
    """(rel_l2, max_abs, abs_l2, finite_mismatch) of kernel vs oracle."""
    k, o = _as64(kernel), _as64(oracle)
    if k.shape != o.shape:
        return math.inf, math.inf, math.inf, True
    bad_finite = bool(np.any(~np.isfinite(k) & np.isfinite(o)))
    diff = np.where(np.isfinite(o), k - o, 0.0)
    diff = np.where(np.isfinite(diff), diff, math.inf)
    abs_l2 = float(np.linalg.norm(diff.ravel()))
    norm = float(np.linalg.norm(np.where(np.isfinite(o), o, 0.0).ravel()))
    rel = abs_l2 / norm if norm > 0 else (0.0 if abs_l2 == 0 else math.inf)
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    return rel, max_abs, abs_l2, bad_finite


def _max_abs_finite(x) -> float:
    x = _as64(x)
    finite = x[np.isfinite(x)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def bounded(name, actual, expected, bound_rel: float, bound_abs: float,
            dtype: str) -> TensorError:
    """The verdict of one tensor under given bounds: max_abs <= bound_abs and
    either rel_l2 <= bound_rel or the whole difference under the dtype's
    absolute floor (a near-zero expected tensor, e.g. the gradient of an
    all-zero q row under strong decay, has no meaningful relative error).
    A non-finite value where `expected` is finite fails."""
    rel, max_abs, abs_l2, bad = errors(actual, expected)
    shape_ok = np.shape(actual) == np.shape(expected)
    near_zero = abs_l2 <= DTYPES[dtype].abs_floor * math.sqrt(max(1, np.size(expected)))
    passed = (shape_ok and not bad and max_abs <= bound_abs
              and (rel <= bound_rel or near_zero))
    if not shape_ok:
        note = f"shape {np.shape(actual)} != {np.shape(expected)}"
    elif bad:
        note = NON_FINITE
    else:
        note = NEAR_ZERO if near_zero and rel > bound_rel else ""
    return TensorError(name, rel, max_abs, bound_rel, bound_abs, bool(passed), note)


def compare_to_oracle(name, kernel, oracle, reference, dtype: str,
                      declared_reference=None) -> TensorError:
    """Policy bound for one tensor: kernel and same-precision reference vs the
    float64 oracle. Under a declared precision (precision_in_force) a
    tensor beyond the contract's bound is judged again against the
    reference under that precision's rounding model, declared_reference
    (required there): within it, a DEVIATES row."""
    row = _oracle_row(name, kernel, oracle, reference, dtype)
    declared = precision_in_force()
    if declared is None or row.passed:
        return row
    if declared_reference is None:
        raise ValueError(f"{name}: a check under the declared precision {declared.name!r} "
                         f"passed no reference at that precision")
    return _deviation(row, _oracle_row(name, kernel, oracle, declared_reference,
                                       _wider(dtype, declared.bounds)))


def _oracle_row(name, kernel, oracle, reference, dtype: str) -> TensorError:
    ref_rel, ref_abs, _, _ = errors(reference, oracle)
    ref_rel = ref_rel if math.isfinite(ref_rel) else 0.0
    ref_abs = ref_abs if math.isfinite(ref_abs) else 0.0
    tol = DTYPES[dtype]
    bound_rel = max(RATIO * ref_rel, tol.rel_floor)
    bound_abs = max(RATIO * ref_abs, tol.rel_floor * _max_abs_finite(oracle), tol.abs_floor)
    return bounded(name, kernel, oracle, bound_rel, bound_abs, dtype)


def _wider(dtype: str, other: str) -> str:
    """Of two DTYPES keys, the one with the larger floors."""
    return max((dtype, other), key=lambda d: DTYPES[d].rel_floor)


def _deviation(contract: TensorError, declared: TensorError) -> TensorError:
    """The verdict of a tensor that missed the contract's bound: the
    declared precision's row, marked DEVIATES (with its ratio at the
    contract's bound) when it passed there."""
    if not declared.passed:
        return declared
    note = f"{NEAR_ZERO}; {DEVIATES}" if declared.near_zero else DEVIATES
    return dataclasses.replace(declared, note=note, deviation=contract.ratio)


def tensor_of(row: TensorError) -> str:
    """The tensor a row is about: its name's first word ("da_log (split 1+15
    vs one call)" -> "da_log")."""
    return row.name.split()[0]


def at_declared_tolerance(rows: Iterable[TensorError],
                          factors: Mapping[str, float]) -> List[TensorError]:
    """One check's rows judged again at the target author's declared
    tolerance (KernelDeclaration.tolerance: tensor -> factor F over the
    policy's bound, as torch's toleranceOverride): a finite numeric row of
    such a tensor that missed its bound by at most F passes, its bounds
    times F, marked TOLERATED with its ratio at the policy's bound; beyond
    F it fails as before, marked BEYOND_TOLERANCE. Structural and
    non-finite rows are never tolerated; other tensors are untouched."""
    rows = list(rows)
    if not factors:
        return rows
    judged = []
    for r in rows:
        factor = factors.get(tensor_of(r))
        numeric = (r.bound_rel or r.bound_abs) and math.isfinite(r.ratio)
        if factor is None or r.passed or not numeric or r.note == NON_FINITE:
            judged.append(r)
        elif r.ratio <= factor:
            note = (f"{NEAR_ZERO}; " if r.near_zero else "") + f"{TOLERATED} x{factor:g}"
            judged.append(dataclasses.replace(
                r, bound_rel=r.bound_rel * factor, bound_abs=r.bound_abs * factor,
                passed=True, note=note, tolerated=r.ratio))
        else:
            judged.append(dataclasses.replace(
                r, note=(f"{r.note}; " if r.note else "") + f"{BEYOND_TOLERANCE} x{factor:g}"))
    return judged


def compare_self(name, a, b, dtype: str, exact: bool = False) -> TensorError:
    """Kernel-vs-kernel comparison under the dtype's self_bound (exact=True:
    bitwise equality)."""
    if exact:
        a_, b_ = np.ascontiguousarray(a), np.ascontiguousarray(b)
        same = a_.shape == b_.shape and a_.dtype == b_.dtype and \
            np.array_equal(a_.view(np.uint8), b_.view(np.uint8))
        rel, max_abs, _, _ = errors(a, b)
        return TensorError(name, rel, max_abs, 0.0, 0.0, bool(same),
                           "" if same else "not bitwise equal")
    return _compare_under(name, a, b, dtype, "self_bound")


def compare_handoff(name, split, whole, dtype: str) -> TensorError:
    """A call cut into pieces with the carried state vs one call, under the
    dtype's handoff bound (relative, and absolute times max(1, max|whole|))."""
    return _compare_under(name, split, whole, dtype, "handoff")


def compare_sharded(name, sharded, one_device, dtype: str) -> TensorError:
    """The ops over a mesh vs on one device, under the dtype's sharded bound
    (relative, and absolute times max(1, max|one_device|))."""
    return _compare_under(name, sharded, one_device, dtype, "sharded")


def _compare_under(name, actual, expected, dtype: str, kind: str) -> TensorError:
    """actual vs expected under the dtype's relative bound of this kind (a
    DtypeTolerance field; absolute: that times max(1, max|expected|)); under
    a declared precision a miss is judged again at that precision's row of
    the same kind (the larger)."""
    scale = max(1.0, _max_abs_finite(expected))
    bound = getattr(DTYPES[dtype], kind)
    row = bounded(name, actual, expected, bound, bound * scale, dtype)
    declared = precision_in_force()
    if declared is None or row.passed:
        return row
    wide = max(bound, getattr(DTYPES[declared.bounds], kind))
    return _deviation(row, bounded(name, actual, expected, wide, wide * scale,
                                   _wider(dtype, declared.bounds)))


def format_table(rows: Iterable[TensorError]) -> str:
    """Per-tensor table: tensor, rel-L2, max-abs, bounds, ratio, verdict."""
    rows = list(rows)
    head = f"{'tensor':<16}{'rel-L2':>11}{'bound':>11}{'max-abs':>11}{'bound':>11}{'ratio':>8}  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        verdict = "ok" if r.passed else "FAIL"
        if r.note:
            beyond = r.deviation or r.tolerated
            verdict += f" ({r.note}" + (f": {beyond:.3g}x its bound)" if beyond else ")")
        lines.append(f"{r.name:<16}{r.rel_l2:>11.3e}{r.bound_rel:>11.3e}{r.max_abs:>11.3e}"
                     f"{r.bound_abs:>11.3e}{r.ratio:>8.2f}  {verdict}")
    return "\n".join(lines)


def worst(rows: List[TensorError]) -> Optional[TensorError]:
    return max(rows, key=lambda r: r.ratio) if rows else None


def raised_class(err: BaseException) -> str:
    """The failure class of a check that raised instead of giving rows."""
    return f"raised {type(err).__name__}"


def raised_message(err: BaseException, width: int = 160) -> str:
    """The first line of a raised exception's message, cut to `width`."""
    text = (str(err).strip().splitlines() or [""])[0]
    return text if len(text) <= width else text[:width - 3] + "..."


def failure_class(rows: Iterable[TensorError], dtype: str) -> str:
    """The class of one failing example: its worst failing tensor (a
    non-finite one first), the case's input dtype, and whether the miss is
    "non-finite", "finite" or "structural" (a row with no numeric bound),
    e.g. "dg float32 non-finite". Failures of different classes are
    different findings: each is shrunk, written to a counterexample file and
    replayed on its own (harness.check_property raises a PropertyFailure
    subclass per class, which Hypothesis tells apart). The size of a finite
    miss is not part of the class: one bug's ratios spread over decades
    across examples, and a split there would cut one finding in two."""
    failing = [r for r in rows if not r.passed]
    if not failing:
        return "none"
    row = max(failing, key=lambda r: (r.note == NON_FINITE, r.ratio))
    if row.note == NON_FINITE:
        size = NON_FINITE
    elif row.bound_rel == 0 and row.bound_abs == 0:
        size = "structural"
    else:
        size = "finite"
    return f"{row.name} {dtype} {size}"
