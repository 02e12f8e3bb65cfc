"""Gate regimes and value ranges, shared by the strategies and the input
builders.

gate_regime:
  ordinary      g in about [-1, -0.01]
  no_decay      g = 0 exactly (mixer: softplus(a + dt_bias) underflows to 0)
  strong_decay  g about -70 (exp(g) underflows)
  large_a_log   a_log about 5 (exp(a_log) ~ 150): fast decay through the gate
  mixed         a per-token mix of the above
key_cosine (gated_delta_rule): the keys' mean cosine within a chunk
  0             independent keys (cosine about 1/sqrt(Dk))
  0.5, 0.9      keys sharing a direction, as real keys do
  0.99          near-repeated keys: with beta near 1 and weak decay the
                chunk's I + tril(beta K K^T) is badly conditioned (a series
                inverse of it fails in float32; a triangular solve does not)
  1             repeated keys: one key per chunk (each write replaces the
                last: the delta rule's erase at its extreme)
key_pair_cosine (gated_delta_rule): near-parallel pairs
  0             none
  0.999         every odd token's key nearly parallel to the one before it,
                the other keys as key_cosine makes them
beta_regime:
  ordinary      beta in (0.05, 0.95)
  zero          beta -> 0 (about 1e-13)
  one           beta -> 1 (1 - 1e-13)
  mixed         per token
"""

from __future__ import annotations

import numpy as np

GATE_REGIMES = ("ordinary", "no_decay", "strong_decay", "large_a_log", "mixed")
BETA_REGIMES = ("ordinary", "zero", "one", "mixed")
# independent keys half the time, the correlated regimes the other half
KEY_COSINES = (0.0, 0.0, 0.0, 0.5, 0.9, 0.99, 1.0)
# near-parallel pairs a third of the time
KEY_PAIR_COSINES = (0.0, 0.0, 0.999)

STRONG_DECAY = -70.0
LARGE_A_LOG = 5.0
SATURATED_LOGIT = 30.0


def _per_token_choice(rng, shape, n):
    return rng.integers(0, n, size=shape)


def log_decay(rng, shape, regime: str) -> np.ndarray:
    """g <= 0 for gated_delta_rule, by regime. shape [B, T, Hv]."""
    ordinary = -rng.uniform(0.01, 1.0, size=shape)
    if regime == "ordinary":
        return ordinary
    if regime == "no_decay":
        return np.zeros(shape)
    if regime == "strong_decay":
        return STRONG_DECAY + rng.uniform(-1.0, 1.0, size=shape)
    if regime == "large_a_log":
        return -np.exp(LARGE_A_LOG) * rng.uniform(0.5, 1.0, size=shape)
    if regime == "mixed":
        pick = _per_token_choice(rng, shape, 3)
        strong = STRONG_DECAY + rng.uniform(-1.0, 1.0, size=shape)
        return np.where(pick == 0, ordinary, np.where(pick == 1, 0.0, strong))
    raise ValueError(f"unknown gate regime {regime!r}")


def beta_values(rng, shape, regime: str) -> np.ndarray:
    """beta in [0, 1] for gated_delta_rule, by regime."""
    logits = beta_logits(rng, shape, regime)
    return 1.0 / (1.0 + np.exp(-logits))


def beta_logits(rng, shape, regime: str) -> np.ndarray:
    """b with beta = sigmoid(b), by regime."""
    ordinary = rng.uniform(-3.0, 3.0, size=shape)
    if regime == "ordinary":
        return ordinary
    if regime == "zero":
        return np.full(shape, -SATURATED_LOGIT)
    if regime == "one":
        return np.full(shape, SATURATED_LOGIT)
    if regime == "mixed":
        pick = _per_token_choice(rng, shape, 3)
        return np.where(pick == 0, ordinary,
                        np.where(pick == 1, -SATURATED_LOGIT, SATURATED_LOGIT))
    raise ValueError(f"unknown beta regime {regime!r}")


def gate_inputs(rng, a_shape, a_log_shape, dt_bias_shape, regime: str):
    """(a, a_log, dt_bias) for the mixer's g = -exp(a_log) softplus(a + dt_bias)."""
    a = rng.uniform(-2.0, 2.0, size=a_shape)
    a_log = rng.uniform(-1.0, 1.0, size=a_log_shape)
    dt_bias = rng.uniform(-1.0, 1.0, size=dt_bias_shape)
    if regime == "ordinary":
        return a, a_log, dt_bias
    if regime == "no_decay":            # softplus(-250) underflows to 0 in f32
        return np.full(a_shape, -250.0), a_log, dt_bias
    if regime == "strong_decay":        # exp(log 70) * softplus(~3) ~ 70..
        a_log = np.log(-STRONG_DECAY / 3.05) + rng.uniform(-0.05, 0.05, size=a_log_shape)
        return np.full(a_shape, 3.0) + rng.uniform(-0.1, 0.1, size=a_shape), a_log, dt_bias * 0.0
    if regime == "large_a_log":
        a_log = LARGE_A_LOG + rng.uniform(-0.5, 0.5, size=a_log_shape)
        return a, a_log, dt_bias
    if regime == "mixed":
        pick = _per_token_choice(rng, a_shape, 3)
        a = np.where(pick == 0, a, np.where(pick == 1, -250.0, 12.0))
        return a, a_log, dt_bias
    raise ValueError(f"unknown gate regime {regime!r}")
