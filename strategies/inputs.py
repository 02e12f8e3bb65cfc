"""Arrays from cases: deterministic numpy builders (a case's seed fixes every
value). Arrays are returned as numpy in the case's dtypes (bfloat16 via
ml_dtypes, as shipped with jax)."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from . import regimes, segments
from .cases import DeltaRuleCase, MixerCase

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}


def np_dtype(name: str):
    return DTYPES[name]


def _rows_with_norm(rng, shape, norm: float) -> np.ndarray:
    x = rng.standard_normal(shape)
    return norm * x / np.linalg.norm(x, axis=-1, keepdims=True)


def _correlated_keys(case: DeltaRuleCase, k: np.ndarray) -> np.ndarray:
    """Keys k [B, T, Hk, Dk] (rows of norm key_norm) made to share one
    direction per (batch row, key head, chunk): row t becomes
    norm * unit(sqrt(c) d + sqrt(1 - c) unit(k_t)), mean in-chunk cosine
    about c = key_cosine. The directions come from their own generator, so
    every other input is the one the seed gives with independent keys."""
    b, t, hk, dk = k.shape
    chunks = -(-t // case.chunk)
    rng = np.random.default_rng((case.seed, 1))
    d = _rows_with_norm(rng, (b, chunks, hk, dk), 1.0)
    d = np.repeat(d, case.chunk, axis=1)[:, :t]
    c = case.key_cosine
    mixed = np.sqrt(c) * d + np.sqrt(1.0 - c) * k / case.key_norm   # c = 1: d itself
    return case.key_norm * mixed / np.linalg.norm(mixed, axis=-1, keepdims=True)


def _near_parallel_pairs(case: DeltaRuleCase, k: np.ndarray) -> np.ndarray:
    """Keys k [B, T, Hk, Dk] with every odd token's key replaced by one of
    the same norm at cosine about key_pair_cosine to the key before it (the
    perturbation from its own generator)."""
    rng = np.random.default_rng((case.seed, 2))
    k = k.copy()
    before = k[:, 0:k.shape[1] - 1:2] / case.key_norm          # unit keys of even tokens
    noise = _rows_with_norm(rng, before.shape, 1.0)
    c = case.key_pair_cosine
    pair = c * before + np.sqrt(1.0 - c * c) * noise
    k[:, 1::2] = case.key_norm * pair / np.linalg.norm(pair, axis=-1, keepdims=True)
    return k


def deepest_chunk_log_decay(case: DeltaRuleCase) -> float:
    """The most negative cumulative log-decay G_i - G_j (j <= i) reached
    within one chunk of the case's g [B, T, Hv] (float64): below about -88
    exp() of it underflows in float32, and a kernel that forms
    exp(G_i - G_j) on the masked half overflows there (coverage measure)."""
    g = delta_rule_inputs(case)["g"].astype(np.float64)
    deepest = 0.0
    for start in range(0, case.seq_len, case.chunk):
        total = np.cumsum(g[:, start:start + case.chunk], axis=1)
        deepest = min(deepest, float(np.min(total)))   # from the state entering the chunk
    return deepest


def closest_key_pair(case: DeltaRuleCase) -> float:
    """The largest cosine between the keys of two consecutive tokens of the
    case (coverage measure; numpy, float64)."""
    k = delta_rule_inputs(case)["k"].astype(np.float64)
    unit = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-30)
    return float(np.max(np.sum(unit[:, 1:] * unit[:, :-1], axis=-1), initial=0.0))


@functools.lru_cache(maxsize=256)      # several coverage claims read it per case
def chunk_geometry(case: DeltaRuleCase):
    """(largest mean key cosine, largest 2-norm condition number of the chunk
    matrix I + strict_lower(diag(beta) K K^T * exp(G_i - G_j))) over the
    case's chunks of at least two tokens, batch rows and heads, from its
    inputs: how hard the chunk's triangular inverse is (coverage measures;
    numpy, float64)."""
    x = delta_rule_inputs(case)
    k = np.repeat(x["k"].astype(np.float64), case.group, axis=2)
    g, beta = x["g"].astype(np.float64), x["beta"].astype(np.float64)
    cosine, condition = 0.0, 1.0
    for start in range(0, case.seq_len - 1, case.chunk):
        sl = slice(start, min(start + case.chunk, case.seq_len))
        kc, gc, bc = k[:, sl], np.cumsum(g[:, sl], axis=1), beta[:, sl]
        for b in range(case.batch):
            for h in range(case.v_heads):
                unit = kc[b, :, h] / np.maximum(np.linalg.norm(kc[b, :, h], axis=-1,
                                                               keepdims=True), 1e-30)
                n = len(unit)
                cosine = max(cosine, float(((unit @ unit.T).sum() - n) / (n * (n - 1))))
                decay = np.exp(np.minimum(gc[b, :, h, None] - gc[b, None, :, h], 0.0))
                a = np.tril(bc[b, :, h, None] * (kc[b, :, h] @ kc[b, :, h].T) * decay, -1)
                condition = max(condition, float(np.linalg.cond(np.eye(n) + a)))
    return cosine, condition


def delta_rule_inputs(case: DeltaRuleCase) -> dict:
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv];
    initial_state [B, Hv, Dk, Dv] or None. q, k rows have norm key_norm."""
    rng = np.random.default_rng(case.seed)
    b, t, hk, hv = case.batch, case.seq_len, case.k_heads, case.v_heads
    q = _rows_with_norm(rng, (b, t, hk, case.dk), 1.0)
    k = _rows_with_norm(rng, (b, t, hk, case.dk), case.key_norm)
    if case.key_cosine:
        k = _correlated_keys(case, k)
    if case.key_pair_cosine:
        k = _near_parallel_pairs(case, k)
    for which, bi, ti, hi in case.zero_rows:
        (q if which == "q" else k)[bi, ti, hi] = 0.0
    v = rng.standard_normal((b, t, hv, case.dv))
    g = regimes.log_decay(rng, (b, t, hv), case.gate_regime)
    beta = regimes.beta_values(rng, (b, t, hv), case.beta_regime)
    s0 = rng.standard_normal((b, hv, case.dk, case.dv)) if case.has_initial_state else None
    act = np_dtype(case.dtype)
    out = {n: x.astype(act) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}
    out["g"] = np.minimum(out["g"], 0).astype(act)  # rounding must keep g <= 0
    out["initial_state"] = None if s0 is None else s0.astype(np_dtype(case.state_dtype))
    return out


def _zero_window(x, case: MixerCase, row) -> None:
    """Make the post-Conv1D+SiLU q/k row `row` exactly zero (magnitude 0) or
    tiny: zero x on the K taps feeding that token for the row's channels,
    then (tiny case) put back a small ramp so the row norm is ~magnitude."""
    offset = 0 if row.which == "q" else case.k_heads * case.dk
    c0 = offset + row.head * case.dk
    t0 = max(0, row.token - case.conv_width + 1)
    x[row.batch, t0:row.token + 1, c0:c0 + case.dk] = 0.0
    if row.magnitude > 0:
        # conv taps of the last token only see x[token]; silu(z) ~ z/2 near 0
        x[row.batch, row.token, c0:c0 + case.dk] = row.magnitude


def mixer_inputs(case: MixerCase) -> dict:
    """x [B, T, C], conv_weight [K, C], a, b [B, T, Hv], a_log, dt_bias."""
    rng = np.random.default_rng(case.seed)
    bsz, t, hv = case.batch, case.seq_len, case.v_heads
    x = rng.standard_normal((bsz, t, case.channels))
    if not case.use_qk_norm:
        # keep |k|^2 small so beta |k|^2 <= 2: the recurrence stays stable
        x[..., : 2 * case.k_heads * case.dk] *= 0.5 / np.sqrt(case.dk)
    weight = rng.uniform(-1.0, 1.0, size=(case.conv_width, case.channels)) / np.sqrt(case.conv_width)
    # tiny rows first, exact-zero rows last: where windows overlap, zero wins,
    # so every row claimed exactly zero is exactly zero after the conv
    for row in sorted(case.near_zero, key=lambda r: r.magnitude == 0):
        _zero_window(x, case, row)
    if any(r.magnitude > 0 for r in case.near_zero):
        # the last tap must carry the tiny row; give it weight 1 on those channels
        for row in case.near_zero:
            offset = 0 if row.which == "q" else case.k_heads * case.dk
            c0 = offset + row.head * case.dk
            weight[-1, c0:c0 + case.dk] = np.where(row.magnitude > 0, 1.0, weight[-1, c0:c0 + case.dk])
    a, a_log, dt_bias = regimes.gate_inputs(rng, (bsz, t, hv), case.a_log_shape,
                                            case.dt_bias_shape, case.gate_regime)
    b = regimes.beta_logits(rng, (bsz, t, hv), case.beta_regime)
    act, par = np_dtype(case.dtype), np_dtype(case.param_dtype)
    return {"x": x.astype(act), "conv_weight": weight.astype(par), "a": a.astype(act),
            "b": b.astype(act), "a_log": a_log.astype(par), "dt_bias": dt_bias.astype(par)}


def segment_ids_of(case):
    """The case's segment_ids: int32 [B, T] (0 = padding), or None for an
    unpacked case (segments == ()). Kept out of the *_inputs dicts, whose
    keys are the differentiable inputs."""
    if not case.segments:
        return None
    return segments.segment_ids(case.segments)


def cotangent(seed: int, shape, dtype=np.float64) -> np.ndarray:
    """A random cotangent, deterministic in (seed, shape)."""
    rng = np.random.default_rng([seed, 7919] + list(shape))
    return rng.standard_normal(shape).astype(dtype)
