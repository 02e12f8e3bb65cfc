"""Cases as plain data: frozen, JSON-serialisable descriptions of one example.

A case holds shapes, dtypes, regimes and a seed, never arrays; `build_*`
functions turn it into numpy arrays deterministically. A shrunk
counterexample is therefore a few lines of JSON, and Hypothesis shrinks the
structure (shapes, regimes) rather than floating-point noise.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional, Tuple

from .shapes import HeadLayout


@dataclasses.dataclass(frozen=True)
class NearZeroRow:
    """One q or k row forced to (near) zero at the L2-norm input.

    which: "q" or "k"; batch, token, head: its position (key head);
    magnitude: 0.0 for an exactly zero row, else the target row norm.
    """
    which: str
    batch: int
    token: int
    head: int
    magnitude: float


@dataclasses.dataclass(frozen=True)
class CaseShape:
    """The shape fields both case types start with: batch B, sequence length
    T, key heads Hk, group G = Hv / Hk, Dk, Dv and the chunk size C."""
    batch: int
    seq_len: int
    k_heads: int
    group: int
    dk: int
    dv: int
    chunk: int

    @property
    def layout(self) -> HeadLayout:
        return HeadLayout(self.k_heads, self.group, self.dk, self.dv)

    @property
    def v_heads(self) -> int:
        return self.layout.v_heads

    @property
    def channels(self) -> int:
        """Mixer conv channels C = 2 Hk Dk + Hv Dv."""
        return self.layout.channels


@dataclasses.dataclass(frozen=True)
class DeltaRuleCase(CaseShape):
    """One gated_delta_rule example (inputs q, k, v, g, beta, initial_state).

    key_norm: row norm of k (and q); beta * key_norm**2 <= 2 is a stable
    (contractive) recurrence. key_cosine: the keys' mean cosine within a
    chunk (0: independent keys; 1: repeated keys), the geometry that
    makes the chunk's I + tril(beta K K^T) ill-conditioned. key_pair_cosine:
    every odd token's key's cosine with the one before it (0: not drawn). gate_regime / beta_regime: see
    strategies.regimes. zero_rows: (which, batch, token, key head) rows of q
    or k set to exactly zero. segments: the packed layout, one row layout
    ((id, length), ...) per batch row (strategies.segments); () means
    segment_ids=None. scale: the scale= passed (None: none, the default
    Dk**-0.5; a lattice row's column, strategies.lattice.SCALE_FACTORS).
    """
    dtype: str
    state_dtype: str
    seed: int
    has_initial_state: bool = True
    gate_regime: str = "ordinary"
    beta_regime: str = "ordinary"
    key_norm: float = 1.0
    zero_rows: Tuple[Tuple[str, int, int, int], ...] = ()
    key_cosine: float = 0.0
    key_pair_cosine: float = 0.0
    segments: Tuple[Tuple[Tuple[int, int], ...], ...] = ()
    scale: Optional[float] = None

    @property
    def stable(self) -> bool:
        """beta * |k|^2 <= 2 everywhere (beta < 1 by construction)."""
        return self.key_norm ** 2 <= 2.0


@dataclasses.dataclass(frozen=True)
class MixerCase(CaseShape):
    """One gdn_decoupled_conv1d example (x, conv_weight, a, b, a_log, dt_bias).

    a_log_shape / dt_bias_shape: the parameter shapes ([Hv], [B', Hv] or
    [B', T', Hv], size-1 axes broadcast). param_dtype: dtype of conv_weight,
    a_log and dt_bias (float32 or the activation dtype). segments: the
    packed layout as for DeltaRuleCase; () means segment_ids=None. scale:
    as for DeltaRuleCase.
    """
    conv_width: int
    dtype: str
    param_dtype: str
    a_log_shape: Tuple[int, ...]
    dt_bias_shape: Tuple[int, ...]
    seed: int
    use_qk_norm: bool = True
    eps: float = 1e-6
    gate_regime: str = "ordinary"
    beta_regime: str = "ordinary"
    near_zero: Tuple[NearZeroRow, ...] = ()
    segments: Tuple[Tuple[Tuple[int, int], ...], ...] = ()
    scale: Optional[float] = None


CASE_TYPES = {"DeltaRuleCase": DeltaRuleCase, "MixerCase": MixerCase}

# The fields of a case its lattice row sets (strategies.composite draws them
# jointly from strategies.lattice); every other field is drawn apart from
# the row (seed, regimes, near-zero rows, segments, key geometry, eps).
SHAPE_FIELDS = {
    DeltaRuleCase: tuple(f.name for f in dataclasses.fields(CaseShape)) + (
        "dtype", "state_dtype", "has_initial_state", "scale"),
    MixerCase: tuple(f.name for f in dataclasses.fields(CaseShape)) + (
        "conv_width", "dtype", "param_dtype", "a_log_shape", "dt_bias_shape", "use_qk_norm",
        "scale"),
}


def shape_case(case_type, **fields):
    """A case of case_type with exactly its SHAPE_FIELDS given and every
    other field at its default (seed 0): a lattice row as a case."""
    if set(fields) != set(SHAPE_FIELDS[case_type]):
        raise ValueError(f"{case_type.__name__} shape fields: want {SHAPE_FIELDS[case_type]}, "
                         f"got {tuple(fields)}")
    return case_type(seed=0, **fields)


def shape_of(case):
    """The case's shape alone: shape_case of its SHAPE_FIELDS."""
    return shape_case(type(case), **{n: getattr(case, n) for n in SHAPE_FIELDS[type(case)]})


def case_to_json(case) -> dict:
    """Plain-JSON form: {"type": ..., "fields": {...}}. An unpacked case
    (segments == ()) leaves "segments" out, one with independent keys
    "key_cosine" and "key_pair_cosine", and one at the default scale
    "scale", so its JSON (and the digest of its counterexample file) is what
    it was before these existed."""
    fields = dataclasses.asdict(case)
    if not fields["segments"]:
        del fields["segments"]
    if fields["scale"] is None:
        del fields["scale"]
    for key_geometry in ("key_cosine", "key_pair_cosine"):
        if not fields.get(key_geometry, 1.0):   # independent keys: the JSON of before
            del fields[key_geometry]
    return {"type": type(case).__name__, "fields": fields}


def _tuplify(value):
    if isinstance(value, list):
        return tuple(_tuplify(v) for v in value)
    return value


def case_from_json(data: dict):
    """Inverse of case_to_json."""
    cls = CASE_TYPES[data["type"]]
    fields = dict(data["fields"])
    if cls is MixerCase:
        fields["near_zero"] = tuple(NearZeroRow(**r) for r in fields.get("near_zero", ()))
        fields["a_log_shape"] = tuple(fields["a_log_shape"])
        fields["dt_bias_shape"] = tuple(fields["dt_bias_shape"])
    else:
        fields["zero_rows"] = _tuplify(fields.get("zero_rows", []))
    fields["segments"] = _tuplify(fields.get("segments", []))
    return cls(**fields)


def case_repr(case) -> str:
    """One line of JSON, for failure reports."""
    return json.dumps(case_to_json(case), sort_keys=True)


def replace(case, **changes):
    """dataclasses.replace, re-exported for properties that derive cases."""
    return dataclasses.replace(case, **changes)

