"""The one table of named head layouts: the strategies' lattice, the explicit
(hand-picked) cases and the benchmarks' workloads all take their shapes from
here, so a shape is declared once and a benchmark size names the same layout
a test runs.

A layout fixes everything but the batch and the sequence length:
Hk key heads, G = Hv / Hk value heads per key head, Dk and Dv.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class HeadLayout:
    """k_heads (Hk), group (G = Hv / Hk), dk, dv."""
    k_heads: int
    group: int
    dk: int
    dv: int

    @property
    def v_heads(self) -> int:
        return self.k_heads * self.group

    @property
    def channels(self) -> int:
        """Mixer conv channels C = 2 Hk Dk + Hv Dv."""
        return 2 * self.k_heads * self.dk + self.v_heads * self.dv

    def as_tuple(self) -> Tuple[int, int, int, int]:
        return (self.k_heads, self.group, self.dk, self.dv)


LAYOUTS: Dict[str, HeadLayout] = {
    # --- the strategies' lattice (small: every pair of knob values) -------
    "plain": HeadLayout(1, 1, 16, 16),
    "gva2-dk>dv": HeadLayout(1, 2, 16, 8),
    "gva2-2keys-dk<dv": HeadLayout(2, 2, 8, 16),
    "gva4": HeadLayout(1, 4, 8, 8),
    "2keys-dv24": HeadLayout(2, 1, 16, 24),
    # --- explicit cases (tile-sized dims, as the Pallas kernels see them) --
    "mha-dk<dv": HeadLayout(1, 1, 16, 32),
    "2keys-dk>dv": HeadLayout(2, 1, 32, 16),
    "2keys-dk<dv": HeadLayout(2, 1, 16, 32),
    "gva2-d32x16": HeadLayout(1, 2, 32, 16),
    "gva2-dk<dv": HeadLayout(1, 2, 16, 32),
    "gva4-dk>dv": HeadLayout(1, 4, 32, 16),
    "gva4-d32x64": HeadLayout(1, 4, 32, 64),
    "gva2-d64x32": HeadLayout(1, 2, 64, 32),
    "gva2-2keys-d32x64": HeadLayout(2, 2, 32, 64),
    # --- benchmarks ---------------------------------------------------------
    "bench-quick": HeadLayout(1, 2, 16, 16),
    "bench-d64": HeadLayout(2, 2, 64, 64),
    "bench-d128": HeadLayout(2, 2, 128, 128),
    "bench-decode": HeadLayout(16, 2, 128, 128),   # Hk=16, Hv=32 (decode benchmark)
}

# The layouts the Hypothesis lattice draws from, in lattice order (the first
# is the simplest: where shrinking goes).
LATTICE_LAYOUTS = ("plain", "gva2-dk>dv", "gva2-2keys-dk<dv", "gva4", "2keys-dv24")


def layout(name: str) -> HeadLayout:
    """The named layout; KeyError lists the known names."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise KeyError(f"unknown head layout {name!r}; known: {sorted(LAYOUTS)}") from None
