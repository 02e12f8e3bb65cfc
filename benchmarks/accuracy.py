"""Accuracy under strong decay: each impl's forward outputs and gradients
(float32 inputs) against the float64 oracle (impl="reference" under x64) on
the same inputs, per tensor, as the relative L2 distance of the tolerance
policy (verification.tolerance.errors).

Strong decay: for the delta rule g = log decay per token uniform in
[-STRONG_G, -1]; for the mixer a_log = log(uniform(A_LOW, A_HIGH)), so g =
-exp(a_log) softplus(a + dt_bias) is mostly below -10. There the chunk's
cumulative log decay grows to |G| ~ 1e3 and a float32 difference of two
cumulative sums keeps only ~1e-4 of each exponent: the regime where a plain
chunked implementation loses the a_log gradient.
"""

from __future__ import annotations

import math
from typing import Callable, List

import jax
import jax.numpy as jnp
import numpy as np

from verification.tolerance import errors

from benchmarks import workloads
from benchmarks.workloads import Size

STRONG_G = 30.0
A_LOW, A_HIGH = 20.0, 60.0
ACCURACY_SIZE = Size.of("bench-d64", 1, 256)
ACCURACY_QUICK_SIZE = Size.of("bench-quick", 1, 64)
GRADIENT_NAMES = {"delta_rule": ("dq", "dk", "dv", "dg", "dbeta"),
                  "mixer": ("dx", "dw", "da", "db", "da_log", "ddt_bias")}
OUTPUT_NAMES = {"delta_rule": ("o", "final_state"), "mixer": ("o",)}


def strong_decay_inputs(op: str, size: Size, seed: int):
    """(primals, cotangents) numpy float32 of workloads.make_inputs with the
    decay made strong (see the module docstring)."""
    primals, cots = workloads.make_inputs(op, size, seed)
    rng = np.random.default_rng(seed + 104729)
    if op == "delta_rule":
        primals[3] = -rng.uniform(1.0, STRONG_G, primals[3].shape).astype(np.float32)
    else:
        primals[4] = np.log(rng.uniform(A_LOW, A_HIGH, primals[4].shape)).astype(np.float32)
    return primals, cots


def _outputs_and_grads(op: str, impl: str, size: Size, chunk: int, arrays) -> List[np.ndarray]:
    fwd: Callable = workloads.build_fn(op, impl, "fwd", size, chunk)
    bwd: Callable = workloads.build_fn(op, impl, "fwd+bwd", size, chunk)
    outs = fwd(*arrays)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [np.asarray(x, np.float64) for x in (*outs, *bwd(*arrays))]


def run(ops, impls, size: Size, chunk: int, seed: int, log=print) -> dict:
    """Per (op, impl): {tensor name: relative L2 error vs the float64 oracle}."""
    rows = []
    for op in ops:
        primals, cots = strong_decay_inputs(op, size, seed)
        with jax.enable_x64(True):
            oracle = _outputs_and_grads(op, "reference", size, chunk,
                                        [jnp.asarray(a, jnp.float64) for a in primals + cots])
        names = OUTPUT_NAMES[op] + GRADIENT_NAMES[op]
        for impl in impls:
            if impl == "reference":
                continue
            got = _outputs_and_grads(op, impl, size, chunk,
                                     [jnp.asarray(a) for a in primals + cots])
            errs = {}
            for name, a, b in zip(names, got, oracle):
                rel, _, abs_l2, _ = errors(a, b)
                errs[name] = rel if math.isfinite(rel) else abs_l2
            rows.append({"op": op, "impl": impl, "errors": errs,
                         "worst": max(errs, key=errs.get)})
            log(f"accuracy {op} {impl}: worst {rows[-1]['worst']} "
                f"{errs[rows[-1]['worst']]:.1e}")
    return {"size_label": size.label, "chunk": chunk, "seed": seed,
            "regime": {"delta_rule g": [-STRONG_G, -1.0], "mixer exp(a_log)": [A_LOW, A_HIGH]},
            "rows": rows}


def markdown_section(doc: dict) -> List[str]:
    """The accuracy table (one row per op and impl)."""
    lines = ["", f"## Accuracy under strong decay ({doc['size_label']}, chunk {doc['chunk']}; "
                 "relative L2 error vs the float64 oracle)", ""]
    for op in ("delta_rule", "mixer"):
        rows = [r for r in doc["rows"] if r["op"] == op]
        if not rows:
            continue
        names = OUTPUT_NAMES[op] + GRADIENT_NAMES[op]
        lines += [f"| {op} impl | " + " | ".join(names) + " |",
                  "|---|" + "---:|" * len(names)]
        for r in rows:
            lines.append(f"| {r['impl']} | "
                         + " | ".join(f"{r['errors'][n]:.1e}" for n in names) + " |")
        lines.append("")
    return lines
