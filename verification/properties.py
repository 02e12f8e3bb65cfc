"""The properties, as plain functions `check(target, case) -> rows`.

Each raises PropertyFailure (an AssertionError carrying the per-tensor error
table) when it does not hold. They know nothing of pytest or Hypothesis, so
`gdn-verify replay` reruns exactly the same check on a stored case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import target as hypothesis_target

from gdn_kernels import l2norm as l2norm_lib
from strategies.cases import DeltaRuleCase, MixerCase, replace

from . import runners
from .targets import Target
from .tolerance import TensorError, compare_self, compare_to_oracle, format_table, worst


class PropertyFailure(AssertionError):
    """A property does not hold; .rows holds the error table."""

    def __init__(self, prop: str, rows: List[TensorError], message: str = ""):
        self.prop, self.rows = prop, rows
        super().__init__(f"{prop} failed{': ' + message if message else ''}\n"
                         + format_table(rows))


@dataclasses.dataclass(frozen=True)
class Property:
    name: str
    check: Callable
    case_type: type
    doc: str


PROPERTIES: Dict[str, Property] = {}


def register(name: str, case_type: type):
    def deco(fn):
        PROPERTIES[name] = Property(name, fn, case_type, (fn.__doc__ or "").strip().splitlines()[0])
        return fn
    return deco


def _conclude(prop: str, rows: List[TensorError], message: str = "") -> List[TensorError]:
    w = worst(rows)
    if w is not None and math.isfinite(w.ratio):
        hypothesis_target_safe(w.ratio, f"{prop}: worst error / bound")
    if any(not r.passed for r in rows):
        raise PropertyFailure(prop, rows, message)
    return rows


def hypothesis_target_safe(value: float, label: str) -> None:
    """hypothesis.target() when called inside a Hypothesis test, else nothing."""
    try:
        hypothesis_target(float(value), label=label)
    except Exception:  # outside @given (replay, CLI)
        pass


def _dtype_of(case, name: str) -> str:
    """The dtype (policy key) a tensor is produced in."""
    if name == "final_state":
        return "float32"
    if isinstance(case, MixerCase) and name in ("conv_weight", "a_log", "dt_bias"):
        return case.param_dtype
    if isinstance(case, DeltaRuleCase) and name == "initial_state":
        return case.state_dtype
    return case.dtype


# ======================================================================
# 1-2. parity with the float64 oracle
# ======================================================================
def _parity_rows(case, with_grads: bool, target: Target):
    inputs = runners.case_inputs(case)
    names = runners.output_names(case)
    if with_grads:
        k_out, k_grads = runners.target_vjp(target, case, inputs)
        o_out, o_grads = runners.oracle_vjp(case, inputs)
        r_out, r_grads = runners.reference_vjp(case, inputs)
    else:
        k_out = runners.target_forward(target, case, inputs)
        o_out = runners.oracle_forward(case, inputs)
        r_out = runners.reference_forward(case, inputs)
    rows = [compare_to_oracle(n, k, o, r, _dtype_of(case, n))
            for n, k, o, r in zip(names, k_out, o_out, r_out)]
    if with_grads:
        for n in inputs:
            rows.append(compare_to_oracle("d" + n, k_grads[n], o_grads[n], r_grads[n],
                                          _dtype_of(case, n)))
            rows.append(_shape_dtype_row("d" + n, k_grads[n], inputs[n]))
    return rows


def _shape_dtype_row(name, grad, primal) -> TensorError:
    ok = np.shape(grad) == np.shape(primal) and np.asarray(grad).dtype == np.asarray(primal).dtype
    note = "" if ok else (f"got {np.shape(grad)} {np.asarray(grad).dtype}, primal "
                          f"{np.shape(primal)} {np.asarray(primal).dtype}")
    return TensorError(name + " shape/dtype", 0.0, 0.0, 0.0, 0.0, ok, note)


@register("mixer_forward_parity", MixerCase)
def mixer_forward_parity(target: Target, case: MixerCase):
    """gdn_decoupled_conv1d output matches the float64 oracle."""
    return _conclude("mixer_forward_parity", _parity_rows(case, False, target))


@register("delta_rule_forward_parity", DeltaRuleCase)
def delta_rule_forward_parity(target: Target, case: DeltaRuleCase):
    """gated_delta_rule output and final state match the float64 oracle."""
    return _conclude("delta_rule_forward_parity", _parity_rows(case, False, target))


@register("mixer_gradient_parity", MixerCase)
def mixer_gradient_parity(target: Target, case: MixerCase):
    """Every cotangent of gdn_decoupled_conv1d (x, conv_weight, a, b, a_log,
    dt_bias) matches jax.vjp of the float64 oracle."""
    return _conclude("mixer_gradient_parity", _parity_rows(case, True, target))


@register("delta_rule_gradient_parity", DeltaRuleCase)
def delta_rule_gradient_parity(target: Target, case: DeltaRuleCase):
    """Every cotangent of gated_delta_rule (q, k, v, g, beta, initial_state),
    with a random cotangent on o AND on final_state, matches the oracle."""
    return _conclude("delta_rule_gradient_parity", _parity_rows(case, True, target))


# ======================================================================
# 3. eps consistency forward <-> backward
# ======================================================================
@register("near_zero_rows_vjp_parity", MixerCase)
def near_zero_rows_vjp_parity(target: Target, case: MixerCase):
    """On (near-)zero q/k rows at the L2-norm input, the target's VJP equals
    the oracle's VJP at the same eps, and every cotangent is finite."""
    rows = _parity_rows(case, True, target)
    return _conclude("near_zero_rows_vjp_parity", rows)


FD_STEP = {"float64": 1e-5, "float32": 1e-2}
FD_REL_BOUND = {"float64": 1e-6, "float32": 2e-2}


def _central_difference(fn, inputs, direction, ct, step):
    """<ct, (f(x + h d) - f(x - h d)) / 2h>."""
    plus = {n: inputs[n] + step * direction[n] for n in inputs}
    minus = {n: inputs[n] - step * direction[n] for n in inputs}
    f_plus, f_minus = fn(plus), fn(minus)
    return float(sum(np.sum(c * (p.astype(np.float64) - m.astype(np.float64)))
                     for c, p, m in zip(ct, f_plus, f_minus)) / (2 * step))


def _directional_fd(fn, inputs, direction, ct, step):
    """Directional derivative by central differences with one Richardson
    step, (4 D(h/2) - D(h)) / 3: truncation O(h^4), so curvature near a
    (near-)zero q/k row (l2norm's third derivative ~ eps^-1.5) stays far
    below the bound."""
    coarse = _central_difference(fn, inputs, direction, ct, step)
    fine = _central_difference(fn, inputs, direction, ct, step / 2)
    return (4.0 * fine - coarse) / 3.0


@register("vjp_matches_finite_differences", MixerCase)
def vjp_matches_finite_differences(target: Target, case: MixerCase):
    """The target's VJP agrees with central finite differences of the target's
    OWN forward along a random direction (float64 inputs where the target
    accepts them), so a forward/backward mismatch is caught even if the
    oracle were wrong."""
    inputs64 = {n: x.astype(np.float64) for n, x in runners.case_inputs(case).items()}
    for precision in ("float64", "float32"):
        try:
            with jax.enable_x64(precision == "float64"):
                return _fd_check(target, case, inputs64, precision)
        except (TypeError, ValueError) as err:  # target refuses float64 inputs
            if precision == "float32":
                raise
            last = err
    raise AssertionError(f"unreachable: {last}")


def _fd_check(target, case, inputs64, precision):
    dt = np.float64 if precision == "float64" else np.float32
    inputs = {n: x.astype(dt) for n, x in inputs64.items()}
    fd_case = replace(case, dtype=precision, param_dtype=precision)
    rng = np.random.default_rng(case.seed + 17)
    direction = {n: rng.standard_normal(x.shape).astype(dt) for n, x in inputs.items()}
    fn = runners._target_fn(target, "mixer")

    def forward(named):
        return runners.run_forward(fn, fd_case, named, x64=False)

    out, grads = runners.run_vjp(fn, fd_case, inputs,
                                 tuple(c.astype(dt) for c in runners._cotangents_like(case)))
    ct = tuple(c.astype(np.float64) for c in runners._cotangents_like(case))
    analytic = float(sum(np.sum(grads[n].astype(np.float64) * direction[n]) for n in inputs))
    numeric = _directional_fd(forward, inputs, direction, ct, FD_STEP[precision])
    err = abs(analytic - numeric)
    scale = max(abs(numeric), abs(analytic), 1e-30)
    bound = FD_REL_BOUND[precision]
    row = TensorError(f"<vjp,d> vs FD ({precision})", err / scale, err, bound,
                      bound * scale, bool(err <= bound * scale),
                      f"analytic {analytic:.6e}, fd {numeric:.6e}")
    return _conclude("vjp_matches_finite_differences", [row])


@register("l2norm_scale_invariance", MixerCase)
def l2norm_scale_invariance(target: Target, case: MixerCase):
    """Metamorphic: l2norm(c x, c^2 eps) = l2norm(x, eps), and its VJP at
    (c x, c^2 eps) is 1/c times the VJP at (x, eps) (module hooks
    l2norm_forward / l2norm_backward, else gdn_kernels.l2norm)."""
    fwd = getattr(target.module, "l2norm_forward", l2norm_lib.l2norm_forward)
    bwd = getattr(target.module, "l2norm_backward", l2norm_lib.l2norm_backward)
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((4, case.dk)) * np.array([[0.0], [1e-4], [1e-2], [1.0]])
    dy = rng.standard_normal((4, case.dk))
    rows = []
    for c in (1e-3, 10.0):
        eps = case.eps
        y1 = np.asarray(fwd(jnp.asarray(x, jnp.float32), eps))
        y2 = np.asarray(fwd(jnp.asarray(c * x, jnp.float32), c * c * eps))
        d1 = np.asarray(bwd(jnp.asarray(x, jnp.float32), jnp.asarray(dy, jnp.float32), eps))
        d2 = np.asarray(bwd(jnp.asarray(c * x, jnp.float32), jnp.asarray(dy, jnp.float32), c * c * eps))
        rows.append(compare_self(f"y (c={c:g})", y2, y1, "float32"))
        rows.append(compare_self(f"dx*c (c={c:g})", d2 * c, d1, "float32"))
    return _conclude("l2norm_scale_invariance", rows)


# ======================================================================
# 4. shape preservation of reduced gradients
# ======================================================================
@register("cotangent_shapes_and_dtypes", MixerCase)
def cotangent_shapes_and_dtypes(target: Target, case: MixerCase):
    """Every cotangent of gdn_decoupled_conv1d has exactly its primal's shape
    and dtype (a [B, Hv] a_log keeps its batch axis), checked abstractly."""
    inputs = runners.case_inputs(case)
    fn = runners._target_fn(target, "mixer")
    kw = dict(runners.mixer_static(case))
    names = tuple(inputs)

    def run(*arrays):
        out, pullback = jax.vjp(lambda *a: fn(*a, **kw), *arrays)
        return pullback(jnp.zeros(out.shape, out.dtype))

    specs = [jax.ShapeDtypeStruct(inputs[n].shape, inputs[n].dtype) for n in names]
    grads = jax.eval_shape(run, *specs)
    rows = [_abstract_row("d" + n, g, inputs[n]) for n, g in zip(names, grads)]
    return _conclude("cotangent_shapes_and_dtypes", rows)


def _abstract_row(name, grad, primal) -> TensorError:
    ok = tuple(grad.shape) == tuple(primal.shape) and np.dtype(grad.dtype) == np.dtype(primal.dtype)
    note = "" if ok else f"got {tuple(grad.shape)} {grad.dtype}, primal {primal.shape} {primal.dtype}"
    return TensorError(name, 0.0, 0.0, 0.0, 0.0, ok, note)


def _sum_to_param_shape(g_full, shape):
    """Sum a [B, T, Hv] gradient over the axes a parameter of `shape` was
    broadcast along. Written here, independently of gdn_kernels.gates, so
    the property does not trust the code it checks."""
    if len(shape) == 1:
        rank3 = (1, 1) + tuple(shape)
    elif len(shape) == 2:
        rank3 = (shape[0], 1, shape[1])
    else:
        rank3 = tuple(shape)
    for axis in range(3):
        if rank3[axis] == 1 and g_full.shape[axis] != 1:
            g_full = g_full.sum(axis=axis, keepdims=True)
    return g_full.reshape(shape)


@register("param_gradient_is_broadcast_sum", MixerCase)
def param_gradient_is_broadcast_sum(target: Target, case: MixerCase):
    """A 1-D / 2-D a_log and dt_bias gradient equals the sum over the
    broadcast axes of the gradient of the same values broadcast to
    [B, T, Hv] (and the [B, Hv] gradient keeps its batch axis)."""
    inputs = runners.case_inputs(case)
    full = (case.batch, case.seq_len, case.v_heads)
    full_inputs = dict(inputs)
    for n in ("a_log", "dt_bias"):
        p = inputs[n]
        p3 = p[None, None] if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)
        full_inputs[n] = np.ascontiguousarray(np.broadcast_to(p3, full))
    full_case = replace(case, a_log_shape=full, dt_bias_shape=full)
    _, g_small = runners.target_vjp(target, case, inputs)
    _, g_full = runners.target_vjp(target, full_case, full_inputs)
    rows = []
    for n in ("a_log", "dt_bias"):
        summed = _sum_to_param_shape(g_full[n].astype(np.float64), inputs[n].shape)
        rows.append(_shape_dtype_row("d" + n, g_small[n], inputs[n]))
        rows.append(compare_self("d" + n + " vs sum", g_small[n], summed, _dtype_of(case, n)))
    return _conclude("param_gradient_is_broadcast_sum", rows)


# ======================================================================
# 5. chunk boundaries and metamorphic properties
# ======================================================================
def _policy_dtype(case) -> str:
    return case.dtype


@register("chunk_size_invariance", DeltaRuleCase)
def chunk_size_invariance(target: Target, case: DeltaRuleCase):
    """gated_delta_rule gives the same outputs and gradients for chunk sizes
    16, 32 and 64 (the chunking is an implementation detail)."""
    inputs = runners.case_inputs(case)
    base_out, base_grads = runners.target_vjp(target, replace(case, chunk=16), inputs)
    rows = []
    for chunk in (32, 64):
        out, grads = runners.target_vjp(target, replace(case, chunk=chunk), inputs)
        for n, a, b in zip(runners.output_names(case), out, base_out):
            rows.append(compare_self(f"{n} C={chunk} vs 16", a, b, _dtype_of(case, n)))
        for n in inputs:
            rows.append(compare_self(f"d{n} C={chunk} vs 16", grads[n], base_grads[n],
                                     _dtype_of(case, n)))
    return _conclude("chunk_size_invariance", rows)


def _slice_time(inputs, start, stop):
    return {n: (x if n == "initial_state" else x[:, start:stop]) for n, x in inputs.items()}


@register("split_invariance", DeltaRuleCase)
def split_invariance(target: Target, case: DeltaRuleCase):
    """Running tokens [0:t] then [t:T] with the carried final state equals one
    pass over [0:T] (outputs and final state), for a drawn split point t."""
    if case.seq_len < 2:
        return []
    inputs = runners.case_inputs(case)
    split = 1 + case.seed % (case.seq_len - 1)
    full_out = runners.target_forward(target, case, inputs)
    first_case = replace(case, seq_len=split)
    first = runners.target_forward(target, first_case, _slice_time(inputs, 0, split))
    second_inputs = _slice_time(inputs, split, case.seq_len)
    second_inputs["initial_state"] = first[1]
    second_case = replace(case, seq_len=case.seq_len - split, state_dtype="float32",
                          has_initial_state=True)
    second = runners.target_forward(target, second_case, second_inputs)
    joined = np.concatenate([first[0], second[0]], axis=1)
    rows = [compare_self(f"o (split at {split})", joined, full_out[0], case.dtype),
            compare_self("final_state", second[1], full_out[1], "float32")]
    return _conclude("split_invariance", rows)


@register("causality", MixerCase)
def causality(target: Target, case: MixerCase):
    """Appending tokens never changes earlier outputs of gdn_decoupled_conv1d."""
    extra = case.chunk // 2 + 1
    inputs = runners.case_inputs(case)
    longer = replace(case, seq_len=case.seq_len + extra,
                     a_log_shape=_lengthened(case.a_log_shape, case.seq_len, extra),
                     dt_bias_shape=_lengthened(case.dt_bias_shape, case.seq_len, extra))
    more = runners.case_inputs(longer)
    ext = {}
    for n, x in inputs.items():   # same prefix, fresh suffix on every time axis
        grows = n in ("x", "a", "b") or (n in ("a_log", "dt_bias") and
                                         more[n].shape != x.shape)
        ext[n] = np.concatenate([x, more[n][:, case.seq_len:]], axis=1) if grows else x
    short_out = runners.target_forward(target, case, inputs)[0]
    long_out = runners.target_forward(target, longer, ext)[0][:, :case.seq_len]
    return _conclude("causality", [compare_self("o prefix", long_out, short_out, case.dtype)])


def _lengthened(shape, seq_len, extra):
    """A [B', T, Hv] parameter shape grows with T; every other shape stays."""
    if len(shape) == 3 and shape[1] == seq_len and seq_len > 1:
        return (shape[0], seq_len + extra, shape[2])
    return shape


@register("batch_independence", MixerCase)
def batch_independence(target: Target, case: MixerCase):
    """Each batch row of gdn_decoupled_conv1d equals the op run on that row
    alone (no mixing across the batch axis)."""
    if case.batch < 2:
        case = replace(case, batch=2, a_log_shape=_rebatch(case.a_log_shape, 2),
                       dt_bias_shape=_rebatch(case.dt_bias_shape, 2),
                       near_zero=tuple(r for r in case.near_zero if r.batch == 0))
    inputs = runners.case_inputs(case)
    out = runners.target_forward(target, case, inputs)[0]
    row = case.seed % case.batch
    one = {n: (x[row:row + 1] if _has_batch(n, x, case.batch) else x) for n, x in inputs.items()}
    one_case = replace(case, batch=1, a_log_shape=one["a_log"].shape,
                       dt_bias_shape=one["dt_bias"].shape)
    alone = runners.target_forward(target, one_case, one)[0]
    return _conclude("batch_independence",
                     [compare_self(f"o[row {row}]", alone[0], out[row], case.dtype)])


def _rebatch(shape, batch):
    return shape if len(shape) == 1 or shape[0] == 1 else (batch,) + tuple(shape[1:])


def _has_batch(name, x, batch) -> bool:
    if name == "conv_weight":
        return False
    if name in ("a_log", "dt_bias"):
        return x.ndim >= 2 and x.shape[0] == batch and batch > 1
    return True


@register("gva_equals_explicit_repeat", DeltaRuleCase)
def gva_equals_explicit_repeat(target: Target, case: DeltaRuleCase):
    """GVA: q, k at Hk heads give the same output as q, k repeated G times
    (jnp.repeat on the head axis) with Hk = Hv; dq, dk equal the repeated
    run's cotangents summed over each group."""
    if case.group == 1:
        case = replace(case, group=2)
    inputs = runners.case_inputs(case)
    out, grads = runners.target_vjp(target, case, inputs)
    rep = dict(inputs)
    rep["q"] = np.repeat(inputs["q"], case.group, axis=2)
    rep["k"] = np.repeat(inputs["k"], case.group, axis=2)
    rep_case = replace(case, k_heads=case.v_heads, group=1)
    r_out, r_grads = runners.target_vjp(target, rep_case, rep)
    rows = [compare_self(n, a, b, _dtype_of(case, n))
            for n, a, b in zip(runners.output_names(case), out, r_out)]
    for n in ("q", "k"):
        b, t, hk, d = inputs[n].shape
        summed = r_grads[n].astype(np.float64).reshape(b, t, hk, case.group, d).sum(axis=3)
        rows.append(compare_self("d" + n, grads[n], summed, case.dtype))
    for n in ("v", "g", "beta"):
        rows.append(compare_self("d" + n, grads[n], r_grads[n], case.dtype))
    return _conclude("gva_equals_explicit_repeat", rows)


@register("determinism", MixerCase)
def determinism(target: Target, case: MixerCase):
    """Two runs of gdn_decoupled_conv1d (output and every cotangent) are
    bitwise identical."""
    inputs = runners.case_inputs(case)
    out1, g1 = runners.target_vjp(target, case, inputs)
    out2, g2 = runners.target_vjp(target, case, inputs)
    rows = [compare_self("o", out1[0], out2[0], case.dtype, exact=True)]
    rows += [compare_self("d" + n, g1[n], g2[n], case.dtype, exact=True) for n in inputs]
    return _conclude("determinism", rows)


# ======================================================================
# stability: unstable recurrences must not invent NaNs
# ======================================================================
@register("unstable_no_spurious_nan", DeltaRuleCase)
def unstable_no_spurious_nan(target: Target, case: DeltaRuleCase):
    """On expanding recurrences (beta |k|^2 up to 4) the target never returns
    NaN/inf where the float64 oracle is finite (no parity claimed)."""
    inputs = runners.case_inputs(case)
    k_out, k_grads = runners.target_vjp(target, case, inputs)
    o_out, o_grads = runners.oracle_vjp(case, inputs)
    f32_max = float(np.finfo(np.float32).max)
    rows = []
    pairs = list(zip(runners.output_names(case), k_out, o_out))
    pairs += [("d" + n, k_grads[n], o_grads[n]) for n in inputs]
    for n, k, o in pairs:
        o64 = np.asarray(o, np.float64)
        representable = np.isfinite(o64) & (np.abs(o64) < f32_max / 4)
        spurious = int(np.sum(representable & ~np.isfinite(np.asarray(k, np.float64))))
        rows.append(TensorError(n, 0.0, float(spurious), 0.0, 0.0, spurious == 0,
                                f"{spurious} non-finite where oracle finite" if spurious else ""))
    return _conclude("unstable_no_spurious_nan", rows)


# ======================================================================
# 6. bad input
# ======================================================================
@register("bad_input_raises_named_error", MixerCase)
def bad_input_raises_named_error(target: Target, case: MixerCase):
    """Every generated contract violation raises the documented exception
    type (ValueError, or TypeError for a non-floating dtype) whose message
    names the offending argument; nothing else escapes."""
    import re

    from .bad_input import violations

    rows = []
    for violation, call in violations(target, case).items():
        try:
            call()
            ok, note = False, "no error raised"
        except violation.error as err:
            named = re.search(rf"\b{re.escape(violation.argument)}\b", str(err)) is not None
            ok, note = named, ("" if named else f"message does not name "
                                                f"{violation.argument!r}: {err}")
        except Exception as err:  # noqa: BLE001 - the finding is the wrong type
            ok, note = False, f"{type(err).__name__} instead of {violation.error.__name__}: {err}"
        rows.append(TensorError(violation.kind, 0.0, 0.0, 0.0, 0.0, ok, note[:120]))
    return _conclude("bad_input_raises_named_error", rows)
