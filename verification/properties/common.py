"""Helpers shared by the property families: which dtype's bounds a tensor is
judged by, the oracle-parity rows, shape/dtype rows, and the coverage claims
several families make (each with what every case meeting it asks)."""

from __future__ import annotations

import re

import numpy as np

from strategies.cases import DeltaRuleCase, MixerCase

from ..engine import runners
from ..engine.registry import claim, shape_claim
from ..tolerance import TensorError, compare_to_oracle, precision_in_force, structural_row


# Coverage claims shared by the families, with what every case meeting each
# asks of a target (registry.claim), and whether a case meets it by its
# shape alone (registry.shape_claim).
BFLOAT16 = shape_claim(lambda c: c.dtype == "bfloat16", "dtype:bfloat16")
GVA = shape_claim(lambda c: c.group > 1, "gva")
PACKED = claim(lambda c: bool(c.segments), "segment_ids")
CORE_OP = claim(lambda c: isinstance(c, DeltaRuleCase), "core", "qk_norm:core")
CHUNK_128 = shape_claim(lambda c: c.chunk == 128, "chunk_size:128")
ONE_TOKEN = shape_claim(lambda c: c.seq_len == 1)                           # T=1
ONE_PAST_A_CHUNK = shape_claim(lambda c: c.seq_len == c.chunk + 1)          # T=C+1
PAST_A_CHUNK = shape_claim(lambda c: c.seq_len > c.chunk)                   # T=C+1 or longer
OTHER_SCALE = shape_claim(lambda c: c.scale is not None, "scale")        # scale= != Dk**-0.5
PER_BATCH_A_LOG = shape_claim(                                              # [B,Hv] a_log
    lambda c: len(c.a_log_shape) == 2 and c.a_log_shape[0] == c.batch > 1)


def dtype_of(case, name: str) -> str:
    """The dtype (policy key) a tensor is produced in."""
    if name == "final_state":
        return "float32"
    if isinstance(case, MixerCase) and name in ("conv_weight", "a_log", "dt_bias"):
        return case.param_dtype
    if isinstance(case, DeltaRuleCase) and name == "initial_state":
        return case.state_dtype
    return case.dtype


def shape_dtype_row(name: str, grad, primal) -> TensorError:
    """Structural row: grad (an array or a ShapeDtypeStruct) has exactly the
    primal's shape and dtype."""
    got = (tuple(np.shape(grad)), np.dtype(grad.dtype))
    want = (tuple(np.shape(primal)), np.dtype(primal.dtype))
    return structural_row(name + " shape/dtype", got == want,
                          f"got {got[0]} {got[1]}, primal {want[0]} {want[1]}")


def at_declared_precision(run):
    """run(precision name) for the declared precision the current check is
    judged at (its same-precision reference), or None under the contract."""
    declared = precision_in_force()
    return None if declared is None else run(declared.name)


def parity_rows(target, case, with_grads: bool):
    """Every output (and with_grads: every cotangent, plus its shape/dtype)
    of the target vs the float64 oracle, bounded by the same-precision
    reference's error (verification.tolerance; under a declared precision,
    also its reference's)."""
    inputs = runners.case_inputs(case)
    names = runners.output_names(case)
    if with_grads:
        k_out, k_grads = runners.target_vjp(target, case, inputs)
        o_out, o_grads = runners.oracle_vjp(case, inputs)
        r_out, r_grads = runners.reference_vjp(case, inputs)
        d_out, d_grads = at_declared_precision(
            lambda p: runners.reference_vjp(case, inputs, p)) or ((None,) * len(names), {})
    else:
        k_out = runners.target_forward(target, case, inputs)
        o_out = runners.oracle_forward(case, inputs)
        r_out = runners.reference_forward(case, inputs)
        d_out = at_declared_precision(
            lambda p: runners.reference_forward(case, inputs, p)) or (None,) * len(names)
    rows = [compare_to_oracle(n, k, o, r, dtype_of(case, n), d)
            for n, k, o, r, d in zip(names, k_out, o_out, r_out, d_out)]
    if with_grads:
        for n in inputs:
            rows.append(compare_to_oracle("d" + n, k_grads[n], o_grads[n], r_grads[n],
                                          dtype_of(case, n), d_grads.get(n)))
            rows.append(shape_dtype_row("d" + n, k_grads[n], inputs[n]))
    return rows


def names_argument(message: str, argument: str) -> bool:
    """The error message names `argument` as an argument: at its start,
    followed by a colon or by `=` (x=float64), or quoted ('x', "x", `x`). A bare word is not
    enough: a one-letter name (x, a, q...) turns up by chance in any
    message, JAX's own errors included."""
    arg = re.escape(argument)
    return re.search(rf"^{arg}\b|(?<![\w.]){arg}[:=]|['\"`]{arg}['\"`]", message) is not None
