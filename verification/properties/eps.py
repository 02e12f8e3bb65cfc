"""eps consistency of the QK L2 norm between forward and backward: the VJP on
(near-)zero rows vs the oracle at the same eps, the VJP vs finite
differences of the target's own forward, and the scale symmetry of the norm."""

from __future__ import annotations

import math
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from strategies import lattice, mixer_cases
from strategies.cases import MixerCase, NearZeroRow, replace

from ..engine import runners
from ..engine.registry import claim, prop
from ..tolerance import NOT_CHECKABLE, TensorError, compare_self, errors
from .common import BFLOAT16, parity_rows

NEAR_ZERO_EPS = (1e-6, 1e-5, 1e-8)

# Regression (docs/kernel-authors.md "Findings"): d a_log 1.2e-4 off in the
# mixed gate regime.
MIXED_GATES_ZERO_Q_ROW = MixerCase(
    batch=1, seq_len=64, k_heads=2, group=1, dk=16, dv=24, chunk=64, conv_width=4,
    dtype="float32", param_dtype="float32", a_log_shape=(1, 2), dt_bias_shape=(1, 1, 2),
    seed=0, gate_regime="mixed",
    near_zero=(NearZeroRow(which="q", batch=0, token=0, head=0, magnitude=0.0),))

NEAR_ZERO_COVERS = {
    "exact-zero row": lambda c: any(r.magnitude == 0 for r in c.near_zero),
    "tiny row ~ sqrt(eps)": lambda c: any(1e-4 <= r.magnitude <= 1e-2 for r in c.near_zero),
    "k row": lambda c: any(r.which == "k" for r in c.near_zero),
    "eps 1e-8": claim(lambda c: c.eps == 1e-8, "qk_norm:1e-08"),
    "bfloat16": BFLOAT16,
}


@prop("near_zero_rows_vjp_parity", family="eps",
      strategy=mixer_cases(near_zero=True, eps_values=NEAR_ZERO_EPS,
                           where=lambda g: g["qk_norm"]),
      wrong_target="gdn_mutant_l2norm_bwd_eps_1e12:xla",
      examples=(MIXED_GATES_ZERO_Q_ROW,), covers=NEAR_ZERO_COVERS)
def near_zero_rows_vjp_parity(target, case: MixerCase):
    """On (near-)zero q/k rows at the L2-norm input, the target's VJP equals
    the oracle's VJP at the same eps, and every cotangent is finite."""
    return parity_rows(target, case, with_grads=True)


# ----------------------------------------------------------------------------
# finite differences of the target's own forward
# ----------------------------------------------------------------------------
FD_STEP = {"float64": 1e-5, "float32": 1e-2}
FD_REL_BOUND = {"float64": 1e-6, "float32": 2e-2}
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24}
# Rounding noise of the Richardson-extrapolated difference, per unit of
# u * ||ct * (|f| + rms f)|| / h: (4 * 2 + 1) / 3 = 3 from the extrapolation,
# times a safety factor for errors correlated through the recurrence.
FD_NOISE_FACTOR = 3 * 16
# A float64 output this close to the float64 oracle was computed in float64.
FLOAT64_COMPUTE_REL = 1e-10


def computing_precision(target, case: MixerCase) -> str:
    """The precision the target really computes in, judged by what it returns
    (not by the dtypes it accepts): "float64" if it takes float64 inputs and
    its float64 output matches the float64 oracle to FLOAT64_COMPUTE_REL,
    else "float32" (it refuses float64 inputs, as the contract allows, or it
    computes in float32 and casts back). Probed on a generic case of the
    same shapes (no near-zero rows, ordinary gates), whose output is of
    order one: an all-zero output would match the oracle in any precision."""
    probe = replace(case, near_zero=(), gate_regime="ordinary", beta_regime="ordinary")
    inputs64 = {n: x.astype(np.float64) for n, x in runners.case_inputs(probe).items()}
    case64 = replace(probe, dtype="float64", param_dtype="float64")
    try:
        with jax.enable_x64(True):
            out = runners.run_forward(runners.target_fn(target, "mixer"), case64, inputs64)[0]
    except (TypeError, ValueError):
        return "float32"
    oracle = runners.oracle_forward(probe, inputs64)[0]
    rel = errors(out, oracle)[0]
    return "float64" if out.dtype == np.float64 and rel <= FLOAT64_COMPUTE_REL else "float32"


def _smooth_direction(case: MixerCase, direction) -> dict:
    """A direction a float32 difference can resolve: zero on the x taps and
    conv_weight channels that feed a (near-)zero q/k row, where the L2 norm
    is not smooth on the scale of any float32-resolvable step (NOTES: an
    all-zero q row gave 16.56 by float32 differences, exact 46.52)."""
    direction = {n: d.copy() for n, d in direction.items()}
    for row in case.near_zero:
        c0 = (0 if row.which == "q" else case.k_heads * case.dk) + row.head * case.dk
        t0 = max(0, row.token - case.conv_width + 1)
        direction["x"][row.batch, t0:row.token + 1, c0:c0 + case.dk] = 0.0
        direction["conv_weight"][:, c0:c0 + case.dk] = 0.0
    return direction


def _central_difference(fn, inputs, direction, ct, step):
    """<ct, (f(x + h d) - f(x - h d)) / 2h>."""
    plus = {n: inputs[n] + step * direction[n] for n in inputs}
    minus = {n: inputs[n] - step * direction[n] for n in inputs}
    f_plus, f_minus = fn(plus), fn(minus)
    return float(sum(np.sum(c * (p.astype(np.float64) - m.astype(np.float64)))
                     for c, p, m in zip(ct, f_plus, f_minus)) / (2 * step))


# The extrapolated difference's truncation error, estimated as this many
# times its change when the step is halved (asymptotically the change is
# 15/16 of the error: the factor is the estimate's margin).
FD_TRUNCATION_FACTOR = 2.0


def _directional_fd(fn, inputs, direction, ct, step) -> Tuple[float, float]:
    """(directional derivative, its truncation error): central differences
    with one Richardson step, R(h) = (4 D(h/2) - D(h)) / 3, truncation
    O(h^4); the error estimated from R(h/2) (FD_TRUNCATION_FACTOR times
    |R(h) - R(h/2)|). Where the derivative vanishes while the function
    curves hard (q and k rows both zero: every first-order term is zero,
    l2norm's fourth derivative ~ eps^-2.5), R(h) is that truncation, not a
    derivative: float64 differences gave -6.6e-10 where autodiff gives 0
    exactly, the float64 oracle's own differences included."""
    coarse = _central_difference(fn, inputs, direction, ct, step)
    fine = _central_difference(fn, inputs, direction, ct, step / 2)
    finer = _central_difference(fn, inputs, direction, ct, step / 4)
    extrapolated = (4.0 * fine - coarse) / 3.0
    return extrapolated, FD_TRUNCATION_FACTOR * abs(extrapolated - (4.0 * finer - fine) / 3.0)


def fd_noise(outputs, ct, precision: str) -> float:
    """Absolute rounding noise of the finite difference of <ct, f> in the
    target's computing precision."""
    total = 0.0
    for f, c in zip(outputs, ct):
        f = np.abs(np.asarray(f, np.float64))
        rms = float(np.sqrt(np.mean(f * f))) if f.size else 0.0
        total += float(np.sum((c * (f + rms)) ** 2))
    return FD_NOISE_FACTOR * UNIT_ROUNDOFF[precision] * math.sqrt(total) / FD_STEP[precision]


# False alarms found on correct targets (no longer raised): on float32 ones
# an all-zero q row (float32 differences 16.56, exact 46.52), a q row at
# sqrt(eps), and beta ~ 0 (derivative 1.7e-11) through a target that takes
# float64 inputs but computes in float32.
FD_ZERO_Q_ROW_T1 = MixerCase(
    batch=1, seq_len=1, k_heads=1, group=1, dk=16, dv=16, chunk=16, conv_width=4,
    dtype="float32", param_dtype="float32", a_log_shape=(1,), dt_bias_shape=(1,), seed=0,
    near_zero=(NearZeroRow(which="q", batch=0, token=0, head=0, magnitude=0.0),))
FD_TINY_Q_ROW_T1 = replace(FD_ZERO_Q_ROW_T1, near_zero=(
    NearZeroRow(which="q", batch=0, token=0, head=0, magnitude=1e-3),))
FD_BETA_ZERO = replace(FD_ZERO_Q_ROW_T1, seq_len=17, beta_regime="zero", seed=3, near_zero=(
    NearZeroRow(which="q", batch=0, token=5, head=0, magnitude=0.0),))
# And on a target computing in float64 (ours, under x64; the float64 oracle
# as well): q and k rows both zero at T=1, a derivative of exactly 0 and
# float64 differences of -6.6e-10 (their truncation), failed at ratio 1e6
# (found by the main job's random draws, 2026-12-06).
FD_ZERO_QK_ROWS_T1 = replace(FD_ZERO_Q_ROW_T1, near_zero=(
    NearZeroRow(which="q", batch=0, token=0, head=0, magnitude=0.0),
    NearZeroRow(which="k", batch=0, token=0, head=0, magnitude=0.0)))


# Short rows keep the finite differences' forward calls cheap; a target that
# takes whole chunks only (Limits.seq_multiple_of_chunk) takes none of them,
# so for it one chunk, the shortest row it takes.
FD_LENGTHS = ("1", "C-1", "C+1")


def _fd_geometry(geo) -> bool:
    limits = lattice.declared_limits()
    whole_chunks = limits is not None and limits.seq_multiple_of_chunk
    return geo["qk_norm"] and geo["length"] in FD_LENGTHS + (("C",) if whole_chunks else ())


@prop("vjp_matches_finite_differences", family="eps",
      strategy=mixer_cases(near_zero=True, where=_fd_geometry),
      wrong_target="gdn_mutant_l2norm_bwd_eps_1e12:xla", weight=0.5,
      examples=(FD_ZERO_Q_ROW_T1, FD_TINY_Q_ROW_T1, FD_BETA_ZERO, FD_ZERO_QK_ROWS_T1),
      covers={"exact-zero row": NEAR_ZERO_COVERS["exact-zero row"],
              "beta ~ 0": lambda c: c.beta_regime == "zero"})
def vjp_matches_finite_differences(target, case: MixerCase):
    """The target's VJP agrees with central finite differences of the
    target's OWN forward along a random direction, in the precision the
    target computes in, so a forward/backward mismatch is caught even if the
    oracle were wrong. In float32 the direction avoids the taps of (near-)zero
    rows and the bound never goes below the difference's rounding noise."""
    precision = computing_precision(target, case)
    dt = np.float64 if precision == "float64" else np.float32
    inputs = {n: x.astype(np.float64).astype(dt) for n, x in runners.case_inputs(case).items()}
    fd_case = replace(case, dtype=precision, param_dtype=precision)
    rng = np.random.default_rng(case.seed + 17)
    direction = {n: rng.standard_normal(x.shape).astype(dt) for n, x in inputs.items()}
    if precision == "float32":
        direction = _smooth_direction(case, direction)
    fn = runners.target_fn(target, "mixer")
    ct = runners.cotangents(case)
    with jax.enable_x64(precision == "float64"):
        out, grads = runners.run_vjp(fn, fd_case, inputs, tuple(c.astype(dt) for c in ct))
        numeric, truncation = _directional_fd(
            lambda named: runners.run_forward(fn, fd_case, named),
            inputs, direction, ct, FD_STEP[precision])
    analytic = float(sum(np.sum(grads[n].astype(np.float64) * direction[n]) for n in inputs))
    err = abs(analytic - numeric)
    scale = max(abs(numeric), abs(analytic), 1e-300)
    noise = fd_noise(out, ct, precision)
    bound_abs = max(FD_REL_BOUND[precision] * scale, noise, truncation)
    note = f"analytic {analytic:.6e}, fd {numeric:.6e}"
    if analytic == 0.0 and numeric == 0.0:
        note = f"{NOT_CHECKABLE}: the output does not move along the direction; " + note
    elif noise >= scale:
        note = f"{NOT_CHECKABLE}: rounding noise {noise:.1e} >= |derivative|; " + note
    elif truncation >= scale:
        note = (f"{NOT_CHECKABLE}: the difference's truncation {truncation:.1e} >= "
                f"|derivative| (it resolves no digit of it); " + note)
    return [TensorError(f"<vjp,d> vs FD ({precision})", err / scale, err, bound_abs / scale,
                        bound_abs, bool(err <= bound_abs), note)]


@prop("l2norm_scale_invariance", family="eps",
      strategy=mixer_cases(eps_values=NEAR_ZERO_EPS), weight=4,
      wrong_target="gdn_mutant_l2norm_bwd_hardcoded_eps:xla",
      needs=("l2norm_hooks",), needs_of_case=lambda case: (),
      covers={"eps 1e-8": lambda c: c.eps == 1e-8, "eps 1e-5": lambda c: c.eps == 1e-5})
def l2norm_scale_invariance(target, case: MixerCase):
    """Metamorphic: l2norm(c x, c^2 eps) = l2norm(x, eps), and its VJP at
    (c x, c^2 eps) is 1/c times the VJP at (x, eps), on the target's declared
    hooks l2norm_forward / l2norm_backward (not checkable without them)."""
    fwd, bwd = target.declaration.l2norm_forward, target.declaration.l2norm_backward
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((4, case.dk)) * np.array([[0.0], [1e-4], [1e-2], [1.0]])
    dy = rng.standard_normal((4, case.dk))
    rows = []
    for c in (1e-3, 10.0):
        eps = case.eps
        y1 = np.asarray(fwd(jnp.asarray(x, jnp.float32), eps))
        y2 = np.asarray(fwd(jnp.asarray(c * x, jnp.float32), c * c * eps))
        d1 = np.asarray(bwd(jnp.asarray(x, jnp.float32), jnp.asarray(dy, jnp.float32), eps))
        d2 = np.asarray(bwd(jnp.asarray(c * x, jnp.float32), jnp.asarray(dy, jnp.float32),
                            c * c * eps))
        rows.append(compare_self(f"y (c={c:g})", y2, y1, "float32"))
        rows.append(compare_self(f"dx*c (c={c:g})", d2 * c, d1, "float32"))
    return rows
