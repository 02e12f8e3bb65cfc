"""The tolerance policy: one place, written down.

Every tensor is compared with the float64 oracle (the token scan with plain
autodiff, gdn_kernels.reference, on the same input values cast to float64)
by two numbers:
  rel_l2  = ||kernel - oracle||_2 / ||oracle||_2
  max_abs = max |kernel - oracle|
Each is bounded by RATIO times the error that the SAME-PRECISION REFERENCE
(the same token scan, run on the case's own dtypes) makes against the oracle,
with floors:
  bound_rel = max(RATIO * ref_rel_l2, REL_FLOOR[dtype])
  bound_abs = max(RATIO * ref_max_abs, REL_FLOOR[dtype] * max|oracle|,
                  ABS_FLOOR[dtype])
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
- REL_FLOOR protects against a same-precision reference that is by chance
  almost exact: float32 2e-6 (the 95th-percentile chunked error), bfloat16
  8e-3 (two bf16 ulps at the output cast).
- ABS_FLOOR: float32 1e-6, bfloat16 4e-3 (absolute noise of a unit-scale
  tensor at the output cast).
Never loosen a number here to make a test pass: a red test is a finding.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, List, Optional

import numpy as np

RATIO = 32.0
REL_FLOOR = {"float32": 2e-6, "bfloat16": 8e-3, "float64": 1e-12}
ABS_FLOOR = {"float32": 1e-6, "bfloat16": 4e-3, "float64": 1e-12}

# Kernel-vs-kernel comparisons (metamorphic properties: chunk-size and split
# invariance, causality, batch independence, GVA = repeat, broadcast sums):
# both sides carry the kernel's own rounding, so the bound is two kernel
# error budgets: 2 * RATIO * (float32 token-scan error ~3e-7) ~ 2e-5.
SELF_REL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float64": 1e-12}
SELF_ABS = {"float32": 2e-5, "bfloat16": 1.6e-2, "float64": 1e-12}


@dataclasses.dataclass(frozen=True)
class TensorError:
    """One row of an error table."""
    name: str
    rel_l2: float
    max_abs: float
    bound_rel: float
    bound_abs: float
    passed: bool
    note: str = ""

    @property
    def ratio(self) -> float:
        """Worst of rel/bound_rel and abs/bound_abs (1.0 = at the bound)."""
        if self.bound_rel == 0 and self.bound_abs == 0:   # exact / structural rows
            return 0.0 if self.passed else math.inf
        r = self.rel_l2 / self.bound_rel if self.bound_rel else math.inf
        a = self.max_abs / self.bound_abs if self.bound_abs else math.inf
        return a if self.note == "near-zero" else max(r, a)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"ratio": self.ratio}


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


def compare_to_oracle(name, kernel, oracle, reference, dtype: str) -> TensorError:
    """Policy bound for one tensor: kernel and same-precision reference vs the
    float64 oracle."""
    rel, max_abs, abs_l2, bad = errors(kernel, oracle)
    ref_rel, ref_abs, _, _ = errors(reference, oracle)
    if not math.isfinite(ref_rel):
        ref_rel = 0.0
    if not math.isfinite(ref_abs):
        ref_abs = 0.0
    o = _as64(oracle)
    scale = float(np.max(np.abs(o[np.isfinite(o)]))) if np.any(np.isfinite(o)) else 0.0
    bound_rel = max(RATIO * ref_rel, REL_FLOOR[dtype])
    bound_abs = max(RATIO * ref_abs, REL_FLOOR[dtype] * scale, ABS_FLOOR[dtype])
    n = max(1, np.size(o))
    near_zero = abs_l2 <= ABS_FLOOR[dtype] * math.sqrt(n)
    shape_ok = np.shape(kernel) == np.shape(oracle)
    passed = (shape_ok and not bad and max_abs <= bound_abs
              and (rel <= bound_rel or near_zero))
    note = ("shape " + str(np.shape(kernel)) + " != " + str(np.shape(oracle))) if not shape_ok \
        else ("non-finite" if bad else ("near-zero" if near_zero and rel > bound_rel else ""))
    return TensorError(name, rel, max_abs, bound_rel, bound_abs, passed, note)


def compare_self(name, a, b, dtype: str, exact: bool = False) -> TensorError:
    """Kernel-vs-kernel comparison under the SELF_* bounds (exact=True:
    bitwise equality)."""
    if exact:
        a64, b64 = np.asarray(a), np.asarray(b)
        same = a64.shape == b64.shape and a64.dtype == b64.dtype and \
            np.array_equal(a64.view(np.uint8), b64.view(np.uint8))
        rel, max_abs, _, _ = errors(a, b)
        return TensorError(name, rel, max_abs, 0.0, 0.0, bool(same),
                           "" if same else "not bitwise equal")
    rel, max_abs, abs_l2, bad = errors(a, b)
    bound_rel, bound_abs = SELF_REL[dtype], SELF_ABS[dtype] * max(1.0, float(np.max(np.abs(_as64(b))) if np.size(b) else 1.0))
    near_zero = abs_l2 <= ABS_FLOOR[dtype] * math.sqrt(max(1, np.size(b)))
    passed = np.shape(a) == np.shape(b) and not bad and max_abs <= bound_abs and (rel <= bound_rel or near_zero)
    return TensorError(name, rel, max_abs, bound_rel, bound_abs, bool(passed),
                       "non-finite" if bad else "")


def format_table(rows: Iterable[TensorError]) -> str:
    """Per-tensor table: tensor, rel-L2, max-abs, bounds, ratio, verdict."""
    rows = list(rows)
    head = f"{'tensor':<16}{'rel-L2':>11}{'bound':>11}{'max-abs':>11}{'bound':>11}{'ratio':>8}  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        verdict = "ok" if r.passed else "FAIL"
        if r.note:
            verdict += f" ({r.note})"
        lines.append(f"{r.name:<16}{r.rel_l2:>11.3e}{r.bound_rel:>11.3e}{r.max_abs:>11.3e}"
                     f"{r.bound_abs:>11.3e}{r.ratio:>8.2f}  {verdict}")
    return "\n".join(lines)


def worst(rows: List[TensorError]) -> Optional[TensorError]:
    return max(rows, key=lambda r: r.ratio) if rows else None
