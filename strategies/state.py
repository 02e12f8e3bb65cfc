"""Carried state (docs/contract.md section 7): where a mixer case is split
into calls, and the incoming GDNState it starts from. Both are derived from
the case's seed, so a stored counterexample replays the same calls."""

from __future__ import annotations

from typing import Tuple

import numpy as np

from .cases import MixerCase
from .inputs import np_dtype

# Split points of a row of T tokens into two calls T1 + T2 (T >= 2):
# T1 = 1, T1 < K-1 (the second call's conv window reaches into the state's
# history), T1 a chunk multiple, T2 = 1 (a decode step), and one off every
# boundary.
SPLIT_KINDS = ("T1=1", "T1<K-1", "T1=C", "T2=1", "T1=T/2+1")

# Decode steps after a prompt in prompt_then_decode, and in a decode loop.
MAX_DECODE_STEPS = 4
DECODE_LOOP_STEPS = 256


def split_kind(case: MixerCase) -> str:
    return SPLIT_KINDS[case.seed % len(SPLIT_KINDS)]


def split_point(case: MixerCase) -> int:
    """T1 of the case's split (1 <= T1 <= T-1; T >= 2)."""
    t, kind = case.seq_len, split_kind(case)
    t1 = {"T1=1": 1, "T1<K-1": max(1, case.conv_width - 2), "T1=C": case.chunk,
          "T2=1": t - 1, "T1=T/2+1": t // 2 + 1}[kind]
    return min(max(t1, 1), t - 1)


def decode_steps(case: MixerCase) -> int:
    """N single-token calls after a prompt of T - N tokens (T >= 2)."""
    return min(1 + case.seed % MAX_DECODE_STEPS, case.seq_len - 1)


def pieces(case: MixerCase, kind: str) -> Tuple[int, ...]:
    """Call lengths: "one" (T), "split" (T1, T2), "decode" (prompt, 1, ..., 1)."""
    t = case.seq_len
    if kind == "one":
        return (t,)
    if kind == "split":
        t1 = split_point(case)
        return (t1, t - t1)
    n = decode_steps(case)
    return (t - n,) + (1,) * n


def incoming_state(case: MixerCase) -> dict:
    """A non-zero incoming GDNState as numpy: conv [B, K-1, C] in x's dtype
    (values like x), recurrent [B, Hv, Dk, Dv] float32 (like a state after a
    few hundred tokens of unit-norm keys)."""
    rng = np.random.default_rng(case.seed + 7919)
    conv = rng.standard_normal((case.batch, case.conv_width - 1, case.channels))
    rec = rng.standard_normal((case.batch, case.v_heads, case.dk, case.dv)) * 0.5
    return {"conv": conv.astype(np_dtype(case.dtype)), "recurrent": rec.astype(np.float32)}
