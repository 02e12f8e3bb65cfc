"""The contract's conventions of dtype and shape, as the target's own code
produces them: o in v's (x's) dtype, a float32 final state, and every
cotangent in its primal's shape and dtype (docs/contract.md sections 1-3).

For a target wrapped by an adapter (verification.targets.adapters.adapt), the
kernel's own dtypes: where the adapter had to cast an output, a final state
or a cotangent, that is a convention deviation, one failing row per tensor
("dg dtype", "final_state dtype"), which passes only when the author lists
it in the known-failures file with a reason. Checked by tracing the VJP
(dtypes and shapes are static): nothing compiles or runs.
"""

from __future__ import annotations

from hypothesis import strategies as st

from strategies import delta_rule_cases, mixer_cases
from strategies.cases import DeltaRuleCase

from ..engine import runners
from ..targets.adapters import recording_deviations
from ..engine.registry import prop
from ..tolerance import structural_row
from .common import BFLOAT16, CORE_OP, shape_dtype_row

# float32 state and bfloat16 activations: a kernel returning every gradient
# in q's dtype deviates on initial_state (the wrong target's failure).
BF16_ACTIVATIONS_F32_STATE = DeltaRuleCase(
    batch=1, seq_len=17, k_heads=1, group=1, dk=16, dv=16, chunk=16, dtype="bfloat16",
    state_dtype="float32", seed=3)


@prop("conventions_match_contract", family="conventions",
      strategy=st.one_of(delta_rule_cases(), mixer_cases()), weight=0.5,
      wrong_target="verification.fixture_kernels.wrong_targets.gradients_in_q_dtype",
      examples=(BF16_ACTIVATIONS_F32_STATE,),
      covers={"core op": CORE_OP,
              "mixer": lambda c: not isinstance(c, DeltaRuleCase),
              "bfloat16": BFLOAT16})
def conventions_match_contract(target, case):
    """Outputs, final state and every cotangent come back in the contract's
    dtypes and shapes from the target's own code (an adapter's casts are
    convention deviations)."""
    inputs = runners.case_inputs(case)
    with recording_deviations() as deviations:
        outs, grads = runners.target_vjp_shapes(target, case, inputs)
    contract_o = inputs["v" if isinstance(case, DeltaRuleCase) else "x"].dtype
    rows = [structural_row("o dtype", outs[0].dtype == contract_o,
                           f"got {outs[0].dtype}, contract {contract_o}")]
    if isinstance(case, DeltaRuleCase):
        rows.append(structural_row("final_state dtype", outs[1].dtype == "float32",
                                   f"got {outs[1].dtype}, contract float32"))
    rows += [shape_dtype_row("d" + n, grads[n], inputs[n]) for n in inputs]
    rows += [structural_row(d.tensor, False,
                            f"convention deviation: the kernel returns {d.got} where the "
                            f"contract has {d.contract} (the adapter casts it)")
             for d in deviations]
    return rows
