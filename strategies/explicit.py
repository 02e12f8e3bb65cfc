"""Hand-picked cases of gdn_kernels' own backends, run through the shared
runners and tolerance policy by verification/tests/test_pallas_modes.py (the
contract's acceptance bounds, the XLA twin, float64, and, the small ones,
the gradient-parity properties in the TPU simulator):
T in {1, C-1, C, C+1, 3C+5}, C in {16, 32, 64}, G in {1, 2, 4}, Dk != Dv,
gate-parameter ranks 1/2/3, all-zero q/k rows, bfloat16 activations with
float32 state and parameters, and packed rows (documents starting inside a
chunk and on a chunk edge, left / interior / right padding, an all-padding
row, an id reused by a later document) under strong decay. Shapes are named
layouts of strategies.shapes.
"""

from __future__ import annotations

from typing import Tuple

from .cases import DeltaRuleCase, MixerCase, NearZeroRow
from .shapes import layout


def delta_case(name: str, batch: int, seq_len: int, chunk: int, seed: int, *,
               dtype: str = "float32", zero_rows: bool = False, segments=(),
               gate_regime: str = "ordinary") -> DeltaRuleCase:
    """A gated_delta_rule case on a named layout, with an initial state;
    zero_rows: an all-zero q row at token 0 and k row at the last token;
    segments: row layouts of packed documents (strategies.segments)."""
    lay = layout(name)
    rows = ((("q", 0, 0, 0), ("k", batch - 1, seq_len - 1, lay.k_heads - 1))
            if zero_rows else ())
    return DeltaRuleCase(batch=batch, seq_len=seq_len, k_heads=lay.k_heads,
                         group=lay.group, dk=lay.dk, dv=lay.dv, chunk=chunk, dtype=dtype,
                         state_dtype="float32", seed=seed, zero_rows=rows,
                         segments=segments, gate_regime=gate_regime)


def mixer_case(name: str, batch: int, seq_len: int, chunk: int, seed: int, *,
               param_rank: int, dtype: str = "float32", zero_rows: bool = False,
               segments=(), gate_regime: str = "ordinary") -> MixerCase:
    """A mixer case on a named layout; a_log / dt_bias of rank 1 [Hv],
    2 [B, Hv] or 3 [1, T, Hv]; zero_rows: all-zero q and k rows after the
    conv (first and last token)."""
    lay = layout(name)
    hv = lay.v_heads
    shape = {1: (hv,), 2: (batch, hv), 3: (1, seq_len, hv)}[param_rank]
    rows = ((NearZeroRow("q", 0, 0, 0, 0.0),
             NearZeroRow("k", batch - 1, seq_len - 1, lay.k_heads - 1, 0.0))
            if zero_rows else ())
    return MixerCase(batch=batch, seq_len=seq_len, k_heads=lay.k_heads, group=lay.group,
                     dk=lay.dk, dv=lay.dv, chunk=chunk, conv_width=4, dtype=dtype,
                     param_dtype="float32", a_log_shape=shape, dt_bias_shape=shape,
                     seed=seed, near_zero=rows, segments=segments, gate_regime=gate_regime)


DELTA_CASES: Tuple[DeltaRuleCase, ...] = (
    delta_case("mha-dk<dv", 1, 1, 16, seed=1),                              # T = 1
    delta_case("2keys-dk>dv", 1, 15, 16, seed=2, zero_rows=True),           # C - 1
    delta_case("gva2-dk<dv", 1, 16, 16, seed=3),                            # C
    delta_case("gva4-dk>dv", 2, 17, 16, seed=4),                            # C + 1
    delta_case("gva4-d32x64", 1, 101, 32, seed=8),                          # 3C + 5
    delta_case("gva2-d64x32", 1, 64, 64, seed=9),
    delta_case("gva2-2keys-d32x64", 1, 197, 64, seed=10, zero_rows=True),   # 3C + 5
    delta_case("gva4-dk>dv", 1, 63, 64, seed=11, dtype="bfloat16"),
    delta_case("gva2-dk<dv", 2, 65, 64, seed=12, dtype="bfloat16", zero_rows=True),
)

MIXER_CASES: Tuple[MixerCase, ...] = (
    mixer_case("gva2-dk<dv", 1, 1, 64, seed=21, param_rank=1),
    mixer_case("gva2-dk<dv", 2, 17, 16, seed=22, param_rank=2),
    mixer_case("gva4-dk>dv", 1, 32, 32, seed=23, param_rank=3, zero_rows=True),
    mixer_case("2keys-dk<dv", 1, 101, 32, seed=24, param_rank=2),
    mixer_case("gva2-d32x16", 1, 65, 64, seed=25, param_rank=3),
    mixer_case("gva2-dk<dv", 1, 33, 32, seed=26, param_rank=1, dtype="bfloat16",
               zero_rows=True),
)


# Packed rows of T = 37 with C = 16: a document starting inside the first
# chunk, one on the chunk edge at 16, interior and right padding; left
# padding, a padding run inside one document, an id reused later; a row of
# only padding.
PACKED_T37 = (
    ((1, 5), (2, 11), (3, 9), (0, 3), (4, 7), (0, 2)),
    ((0, 4), (7, 6), (0, 3), (7, 10), (8, 1), (7, 13)),
)
PACKED_EMPTY_ROW = (((0, 20),), ((5, 9), (6, 11)))

PACKED_CASES: Tuple = (
    delta_case("gva2-dk<dv", 2, 37, 16, seed=31, segments=PACKED_T37,
               gate_regime="strong_decay"),
    delta_case("gva4-dk>dv", 2, 20, 16, seed=32, segments=PACKED_EMPTY_ROW),
    delta_case("2keys-dk>dv", 2, 37, 16, seed=33, dtype="bfloat16", segments=PACKED_T37),
    mixer_case("gva2-dk<dv", 2, 37, 16, seed=34, param_rank=3, segments=PACKED_T37,
               gate_regime="strong_decay"),
    mixer_case("gva4-dk>dv", 2, 20, 16, seed=35, param_rank=2, segments=PACKED_EMPTY_ROW),
    mixer_case("2keys-dk<dv", 2, 37, 16, seed=36, param_rank=1, dtype="bfloat16",
               segments=PACKED_T37),
    # small enough for the TPU simulator (<= 8 grid steps)
    delta_case("mha-dk<dv", 2, 20, 16, seed=37, segments=PACKED_EMPTY_ROW),
    mixer_case("mha-dk<dv", 2, 20, 16, seed=38, param_rank=3, segments=PACKED_EMPTY_ROW,
               gate_regime="strong_decay"),
)


def grid_steps(case) -> int:
    """Pallas grid steps of a case: B * Hv * ceil(T / C)."""
    return case.batch * case.v_heads * -(-case.seq_len // case.chunk)
