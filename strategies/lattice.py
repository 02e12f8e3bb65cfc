"""The bounded lattice every shape is drawn from, so that compile counts stay
bounded.

Values, seeds, gate regimes and near-zero rows never change a compiled
shape; shapes, dtypes and static arguments do. So every shape-changing knob
is drawn jointly as one GEOMETRY from a fixed list that covers every PAIR of
knob values at least once (all-pairs / pairwise covering, built greedily and
deterministically below). Compiles are then bounded by the list length,
while each value of each knob, and each pair of values, is still exercised.

Each Hypothesis profile draws from a covering of that list (its compile
budget, PROFILE_COVERING): the dev loop's profile from the fewest rows that
still hold every VALUE of every knob (every boundary length, head layout,
dtype pair, parameter rank; about 8 rows, so a rerun finds its programs in
the compile cache and a run reuses them across examples), the gate's and
nightly profiles from every pair.
"""

from __future__ import annotations

import functools
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

from .shapes import LATTICE_LAYOUTS, LAYOUTS

CHUNK_SIZES = (16, 32, 64)
# The contract's largest chunk size, the one field kernels default to: not a
# knob of the all-pairs rows (it would double them), but a few rows of its
# own appended after them (FIELD_CHUNK_ROWS), crossing the lengths where a
# large chunk matters: one nearly full chunk (the largest chunk matrix and
# its triangular inverse), and a full chunk with a tail. 256 lies outside
# the contract (16..128): drawn only for a target that declares it
# (BEYOND_CONTRACT_CHUNKS below).
FIELD_CHUNK = 128
# Long rows of bfloat16 activations, where a decay sum or a state kept in
# bfloat16 drifts: a few rows of LONG_TOKENS tokens appended after the
# others, drawn only by strategies that ask for them (long_rows=True: the
# forward-parity properties) and only in the "pairs" coverings (ci, kill, nightly):
# the dev loop stays short.
LONG = "long"
LONG_TOKENS = 1029          # > 1024, on no chunk boundary
BATCHES = (1, 2)
CONV_WIDTHS = (4, 2)

# (k_heads, group, dk, dv): Hv = k_heads * group value heads; the named
# layouts of strategies.shapes (plain, GVA with Dk > Dv, several key heads
# with Dk < Dv, G = 4, Dv not a power of two).
HEAD_LAYOUTS = tuple(LAYOUTS[name].as_tuple() for name in LATTICE_LAYOUTS)

# Sequence-length kinds relative to the chunk size C.
LENGTH_KINDS = ("1", "C-1", "C", "C+1", "2C-1", "2C+1", "3C+5", "free")
FREE_LENGTHS = {16: 23, 32: 50, 64: 7}   # on no boundary of that chunk size

# a_log / dt_bias shape kinds: rank and which axes broadcast.
PARAM_KINDS = ("[Hv]", "[1,Hv]", "[B,Hv]", "[B,1,Hv]", "[1,T,Hv]", "[B,T,Hv]", "[1,1,Hv]")

# (activation dtype, parameter/state dtype)
DTYPE_PAIRS = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"))

# scale= as a multiple of the contract's default Dk**-0.5: 1.0 passes none
# (the default), 0.5 passes half the default. A column of the rows, not a
# knob of their all-pairs covering (COLUMNS below): the rows are those of
# the other knobs, each given the value that pairs with the most of its
# knob values not yet seen with it, so a static argument varies without a
# new row (a new compile) or a change to the draws on the rows.
SCALE_FACTORS = (1.0, 0.5)


def scale_of(factor: float, dk: int):
    """The scale= a row's factor passes (None: the default Dk**-0.5)."""
    return None if factor == 1.0 else factor * dk ** -0.5


def boundary_lengths(chunk: int) -> tuple:
    """Lengths on and around chunk boundaries: 1, C-1, C, C+1, 2C-1, 2C+1, 3C+5."""
    return (1, chunk - 1, chunk, chunk + 1, 2 * chunk - 1, 2 * chunk + 1, 3 * chunk + 5)


# Lengths drawn only for a target whose declared limits take whole chunks
# alone (verification.targets.declaration.Limits.seq_multiple_of_chunk): with "C", the lengths of the
# lattice's rows there (several chunks: a state handed on between chunks).
MULTIPLE_LENGTH_KINDS = ("2C", "3C")


def seq_len(kind: str, chunk: int) -> int:
    """The sequence length of a LENGTH_KINDS entry (or LONG, or a
    MULTIPLE_LENGTH_KINDS entry) for chunk size C."""
    if kind == LONG:
        return LONG_TOKENS
    if kind == "free":
        return FREE_LENGTHS[chunk]
    if kind in MULTIPLE_LENGTH_KINDS:
        return int(kind[:-1]) * chunk
    return boundary_lengths(chunk)[LENGTH_KINDS.index(kind)]


def param_shape(kind: str, batch: int, length: int, v_heads: int) -> Tuple[int, ...]:
    """The concrete shape of a PARAM_KINDS entry."""
    return {"[Hv]": (v_heads,), "[1,Hv]": (1, v_heads), "[B,Hv]": (batch, v_heads),
            "[B,1,Hv]": (batch, 1, v_heads), "[1,T,Hv]": (1, length, v_heads),
            "[B,T,Hv]": (batch, length, v_heads), "[1,1,Hv]": (1, 1, v_heads)}[kind]


def all_pairs(knobs: Dict[str, Sequence]) -> List[Dict]:
    """A deterministic greedy pairwise covering: every pair of values of every
    two knobs appears in at least one returned row. Row 0 takes each knob's
    first value (the simplest geometry, where shrinking goes)."""
    names = list(knobs)
    uncovered = {(a, va, b, vb)
                 for a, b in itertools.combinations(names, 2)
                 for va in knobs[a] for vb in knobs[b]}
    rows = []
    first = {n: knobs[n][0] for n in names}

    def gain(row):
        return sum((a, row[a], b, row[b]) in uncovered
                   for a, b in itertools.combinations(names, 2))

    def add(row):
        rows.append(row)
        for a, b in itertools.combinations(names, 2):
            uncovered.discard((a, row[a], b, row[b]))

    add(first)
    while uncovered:
        a, va, b, vb = min(uncovered, key=lambda u: (names.index(u[0]), names.index(u[2]),
                                                     knobs[u[0]].index(u[1]),
                                                     knobs[u[2]].index(u[3])))
        row = {a: va, b: vb}
        for n in names:                       # fill the rest greedily
            if n in row:
                continue
            best = max(knobs[n], key=lambda v: (gain({**row, n: v, **{m: row.get(m, knobs[m][0])
                                                                    for m in names if m not in row and m != n}}),
                                                -knobs[n].index(v)))
            row[n] = best
        add(row)
    return rows


def _batch_and_time(row: Dict) -> bool:
    return row["batch"] > 1 and row["length"] != "1"


# A knob value the values covering counts only in rows where it means
# something: a parameter with a batch or time axis in a row with B = 1 or
# T = 1 is [1, 1, Hv] in disguise (and a gradient summed over the wrong axis,
# the bug this suite exists for, is invisible there).
MEANINGFUL = {"a_log": _batch_and_time, "dt_bias": _batch_and_time}


def values_covering(rows: Sequence[Tuple], names: Sequence[str]) -> List[Tuple]:
    """The fewest rows (greedy, deterministic) of `rows` holding every value
    each knob takes in `rows`, each in a row where it is MEANINGFUL if
    `rows` has one; row 0 first (where shrinking goes), then in the order of
    `rows`."""
    rows = list(rows)
    if not rows:
        return []
    n = len(names)

    def meaningful_values(row):
        d = dict(zip(names, row))
        return {(i, row[i]) for i in range(n)
                if names[i] not in MEANINGFUL or MEANINGFUL[names[i]](d)}

    reachable = set().union(*(meaningful_values(r) for r in rows))
    # what each row covers: its meaningful values, and any value no row
    # makes meaningful (that one counts wherever it appears)
    covers = [meaningful_values(r) | {(i, r[i]) for i in range(n) if (i, r[i]) not in reachable}
              for r in rows]
    uncovered = set().union(*covers)
    picked = [0]                                  # row 0 first: where shrinking goes
    uncovered -= covers[0]
    while uncovered:
        best = max(range(len(rows)), key=lambda j: (len(uncovered & covers[j]), -j))
        picked.append(best)
        uncovered -= covers[best]
    return [rows[j] for j in sorted(picked)]


# The covering each Hypothesis profile draws its geometries from (the
# profiles are verification/engine/profiles.py's); any other profile: "pairs".
COVERINGS = ("values", "pairs")
PROFILE_COVERING = {"dev": "values", "ci": "pairs", "kill": "pairs", "nightly": "pairs",
                    "repro": "pairs"}


def suite_profile(name: Optional[str]) -> Optional[str]:
    """The suite profile a loaded Hypothesis profile is: its name without the
    "-with-..." that Hypothesis's pytest plugin appends to the copy it loads
    for --hypothesis-verbosity or --hypothesis-explain."""
    return name.split("-with-", 1)[0] if name else name


def current_covering() -> str:
    """The covering of the Hypothesis profile now loaded (a verbosity or
    explain copy of a profile: that profile's)."""
    from hypothesis import settings
    return PROFILE_COVERING.get(suite_profile(settings.get_current_profile_name()), "pairs")


@functools.lru_cache(maxsize=None)
def covering(rows: Tuple[Tuple, ...], names: Tuple[str, ...], kind: str) -> Tuple[Tuple, ...]:
    """`rows` (all-pairs rows, already filtered) reduced to the covering
    `kind` (the values covering leaves out the LONG rows)."""
    if kind not in COVERINGS:
        raise ValueError(f"covering must be one of {COVERINGS}, got {kind!r}")
    if kind == "pairs":
        return tuple(rows)
    length = list(names).index("length")
    return tuple(values_covering([r for r in rows if r[length] != LONG], names))


MIXER_KNOBS = {
    "chunk": CHUNK_SIZES, "length": LENGTH_KINDS, "layout": HEAD_LAYOUTS,
    "batch": BATCHES, "conv_width": CONV_WIDTHS, "dtypes": DTYPE_PAIRS,
    "a_log": PARAM_KINDS, "dt_bias": PARAM_KINDS, "qk_norm": (True, False),
    "scale": SCALE_FACTORS,
}

DELTA_KNOBS = {
    "chunk": CHUNK_SIZES, "length": LENGTH_KINDS, "layout": HEAD_LAYOUTS,
    "batch": BATCHES, "dtypes": DTYPE_PAIRS, "initial_state": (True, False),
    "scale": SCALE_FACTORS,
}

# Knobs given to the rows as columns after the all-pairs covering of the
# others (the last knobs of each table): with_columns.
COLUMNS = ("scale",)


_F32, _BF16_F32, _BF16 = DTYPE_PAIRS
_PLAIN, _GVA2, _GVA2_2KEYS, _GVA4, _DV24 = HEAD_LAYOUTS

# Rows at FIELD_CHUNK, in knob order (each knob's value from its table).
MIXER_FIELD_CHUNK_ROWS = (
    (FIELD_CHUNK, "C-1", _PLAIN, 2, 4, _F32, "[B,Hv]", "[Hv]", True),
    (FIELD_CHUNK, "C+1", _GVA4, 1, 2, _BF16_F32, "[Hv]", "[1,T,Hv]", False),
    (FIELD_CHUNK, "2C+1", _GVA2_2KEYS, 2, 4, _BF16, "[B,T,Hv]", "[B,1,Hv]", True),
)
DELTA_FIELD_CHUNK_ROWS = (
    (FIELD_CHUNK, "C-1", _PLAIN, 1, _F32, True),
    (FIELD_CHUNK, "C+1", _GVA2, 2, _BF16_F32, False),
    (FIELD_CHUNK, "2C+1", _DV24, 1, _BF16, True),
)
# LONG rows, bfloat16 activations (float32 and bfloat16 parameters / state).
MIXER_LONG_ROWS = (
    (64, LONG, _GVA2, 1, 4, _BF16_F32, "[Hv]", "[Hv]", True),
    (FIELD_CHUNK, LONG, _PLAIN, 1, 2, _BF16, "[B,Hv]", "[1,T,Hv]", False),
)
DELTA_LONG_ROWS = (
    (64, LONG, _GVA2, 1, _BF16_F32, True),
    (FIELD_CHUNK, LONG, _DV24, 1, _BF16, True),
)


# Chunk sizes beyond the contract's 16..128 that field kernels use: rows of
# their own, drawn only for a target that declares them (the plugin passes
# its declaration on: declare_beyond_contract), never for one that keeps to
# the contract (its draws are those it had before they existed).
MIXER_BEYOND_CONTRACT_ROWS = {256: (
    (256, "C-1", _GVA2, 1, 4, _BF16_F32, "[Hv]", "[B,Hv]", True),
    (256, "C+1", _PLAIN, 2, 2, _F32, "[B,1,Hv]", "[Hv]", False),
)}
DELTA_BEYOND_CONTRACT_ROWS = {256: (
    (256, "C-1", _PLAIN, 1, _F32, True),
    (256, "C+1", _GVA2, 2, _BF16_F32, True),
)}
# The chunk sizes beyond the contract a target may declare
# (declaration.Supports.chunk_sizes): those the tables above have rows of.
BEYOND_CONTRACT_CHUNKS = tuple(MIXER_BEYOND_CONTRACT_ROWS)
_DECLARED = {"beyond_contract": ()}


def declare_beyond_contract(chunk_sizes) -> None:
    """The chunk sizes beyond the contract the session's target declares
    (of BEYOND_CONTRACT_CHUNKS; others are ignored): their rows are drawn."""
    _DECLARED["beyond_contract"] = tuple(sorted(
        c for c in set(chunk_sizes or ()) if c in BEYOND_CONTRACT_CHUNKS))


def declared_beyond_contract() -> Tuple[int, ...]:
    return _DECLARED["beyond_contract"]


# The shape limits the session's target declares (verification.targets.declaration.
# Limits: seq_multiple_of_chunk, batch_sizes, param_ranks and refuses(T, C,
# B, parameter shapes) are read), or None: the lattice is built inside them.
_DECLARED["limits"] = None


def declare_limits(limits) -> None:
    """The target's declared shape limits (None: the contract's shapes)."""
    _DECLARED["limits"] = limits


def declared_limits():
    return _DECLARED["limits"]


# The knob values the session's target takes besides its shape limits, read
# off its declared supports by the plugin (verification.targets.
# declare_to_lattice: a QK norm fixed inside its layer, its activation
# dtypes, no GVA, its chunk sizes, no initial state), as sorted (knob,
# values) pairs: the lattice is built inside them as inside the limits, so
# its covering pairs every other value with one the target takes.
_DECLARED["knob_values"] = ()


def declare_knob_values(values: Dict[str, Sequence]) -> None:
    """The knob values the target takes, {knob: values} ({}: every one)."""
    _DECLARED["knob_values"] = tuple(sorted((k, tuple(v)) for k, v in values.items()))


def declared_knob_values() -> Tuple[Tuple[str, Tuple], ...]:
    return _DECLARED["knob_values"]


def row_refused(limits, geo: Dict) -> Optional[str]:
    """Why a lattice row (a geometry dict) is outside the limits, or None."""
    chunk, length = geo["chunk"], seq_len(geo["length"], geo["chunk"])
    hv = geo["layout"][0] * geo["layout"][1]
    shapes = [param_shape(geo[n], geo["batch"], length, hv) for n in ("a_log", "dt_bias")
              if n in geo]
    return limits.refuses(length, chunk, geo["batch"], shapes)


def _knobs_within(knobs: Dict[str, Sequence], limits) -> Dict[str, Sequence]:
    """The knob values a target with these limits can take (whole chunks
    only: the lengths C, 2C, 3C; its batch sizes; its parameter ranks)."""
    if limits is None:
        return knobs
    knobs = dict(knobs)
    if limits.seq_multiple_of_chunk:
        knobs["length"] = ("C",) + MULTIPLE_LENGTH_KINDS
    if limits.batch_sizes is not None:
        knobs["batch"] = tuple(b for b in knobs["batch"] if b in limits.batch_sizes)
    for name in ("a_log", "dt_bias"):
        if name in knobs:
            knobs[name] = tuple(k for k in knobs[name]
                                if len(param_shape(k, 2, 3, 1)) in limits.param_ranks)
    return knobs


def _knobs_taken(knobs: Dict[str, Sequence], knob_values) -> Dict[str, Sequence]:
    """Each knob's values the target takes (knob_values: declared_knob_values();
    a restriction that would leave a knob no value is not applied: its
    draws stay, not checkable)."""
    knobs = dict(knobs)
    for name, taken in knob_values:
        kept = tuple(v for v in knobs.get(name, ()) if v in taken)
        if kept:
            knobs[name] = kept
    return knobs


def with_columns(rows: Sequence[Tuple], names: Sequence[str],
                 columns: Dict[str, Sequence]) -> Tuple[Tuple, ...]:
    """rows (tuples in `names` order) each extended by one value of every
    column, in order: the value pairing with the most of the row's knob
    values not yet seen with it (the first value on a tie), so every value
    meets as many knob values as the rows allow, and no row is added."""
    rows = [tuple(r) for r in rows]
    for column, values in columns.items():
        seen = set()
        extended = []
        for row in rows:
            value = max(values, key=lambda v: (sum((i, row[i], v) not in seen
                                                   for i in range(len(names))),
                                               -list(values).index(v)))
            seen.update((i, row[i], value) for i in range(len(names)))
            extended.append(row + (value,))
        rows, names = extended, list(names) + [column]
    return tuple(rows)


def _rows(knobs, extra_rows, limits, knob_values=()) -> Tuple[Tuple, ...]:
    """The all-pairs rows of the knob values within the limits and taken by
    the target, then the extra rows, those outside either dropped; the
    COLUMNS given to them last (with_columns)."""
    within = _knobs_taken(_knobs_within(knobs, limits), knob_values)
    names = list(knobs)
    if any(not values for values in within.values()):
        return ()
    paired = [n for n in names if n not in COLUMNS]
    assert names == paired + [n for n in names if n in COLUMNS], "COLUMNS come last"
    taken = dict(knob_values)
    extra = tuple(r for r in extra_rows
                  if all(r[i] in taken[n] for i, n in enumerate(paired) if n in taken))
    base = tuple(tuple(r[n] for n in paired)
                 for r in all_pairs({n: within[n] for n in paired})) + extra
    rows = with_columns(base, paired, {n: within[n] for n in names if n in COLUMNS})
    if limits is None:
        return rows
    return tuple(r for r in rows if not row_refused(limits, dict(zip(names, r))))


@functools.lru_cache(maxsize=None)
def mixer_geometries(beyond_contract: Tuple[int, ...] = (),
                     limits=None, knob_values=()) -> Tuple[Tuple, ...]:
    """The mixer lattice: tuples in MIXER_KNOBS order (the all-pairs rows,
    then the FIELD_CHUNK and LONG rows, then the rows of the chunk sizes
    beyond the contract given), inside the limits and knob values given."""
    return _rows(MIXER_KNOBS, MIXER_FIELD_CHUNK_ROWS + MIXER_LONG_ROWS
                 + sum((MIXER_BEYOND_CONTRACT_ROWS[c] for c in beyond_contract), ()), limits,
                 knob_values)


@functools.lru_cache(maxsize=None)
def delta_geometries(beyond_contract: Tuple[int, ...] = (),
                     limits=None, knob_values=()) -> Tuple[Tuple, ...]:
    """The gated_delta_rule lattice: tuples in DELTA_KNOBS order (the
    all-pairs rows, then the FIELD_CHUNK and LONG rows, then the rows of the
    chunk sizes beyond the contract given), inside the limits and knob
    values given."""
    return _rows(DELTA_KNOBS, DELTA_FIELD_CHUNK_ROWS + DELTA_LONG_ROWS
                 + sum((DELTA_BEYOND_CONTRACT_ROWS[c] for c in beyond_contract), ()), limits,
                 knob_values)
