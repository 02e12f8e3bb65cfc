"""Stability: an expanding (non-contractive) recurrence may overflow, but the
target must never return NaN/inf where the float64 oracle is finite."""

from __future__ import annotations

import numpy as np

from strategies import delta_rule_cases
from strategies.cases import DeltaRuleCase

from ..engine import runners
from ..engine.registry import prop
from ..tolerance import structural_row


@prop("unstable_no_spurious_nan", family="stability",
      strategy=delta_rule_cases(stable=False, where=lambda g: g["dtypes"] == ("float32", "float32")),
      weight=0.5, wrong_target="gdn_mutant_mask_after_exp:xla",
      covers={"|k|^2 = 4": lambda c: c.key_norm == 2.0,
              "strong decay": lambda c: c.gate_regime == "strong_decay"})
def unstable_no_spurious_nan(target, case: DeltaRuleCase):
    """On expanding recurrences (beta |k|^2 up to 4) the target never returns
    NaN/inf where the float64 oracle is finite (no parity claimed)."""
    inputs = runners.case_inputs(case)
    k_out, k_grads = runners.target_vjp(target, case, inputs)
    o_out, o_grads = runners.oracle_vjp(case, inputs)
    f32_max = float(np.finfo(np.float32).max)
    pairs = list(zip(runners.output_names(case), k_out, o_out))
    pairs += [("d" + n, k_grads[n], o_grads[n]) for n in inputs]
    rows = []
    for n, k, o in pairs:
        o64 = np.asarray(o, np.float64)
        representable = np.isfinite(o64) & (np.abs(o64) < f32_max / 4)
        spurious = int(np.sum(representable & ~np.isfinite(np.asarray(k, np.float64))))
        rows.append(structural_row(n, spurious == 0, f"{spurious} non-finite where oracle finite"))
    return rows
