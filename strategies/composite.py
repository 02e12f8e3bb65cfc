"""Composite case strategies: delta_rule_cases and mixer_cases.

Shapes, dtypes and static arguments come jointly from the all-pairs lattice
(strategies.lattice), so compiles stay bounded; seeds, regimes and
near-zero rows are drawn freely. Every knob is a keyword so properties
narrow a strategy (one dtype, only near-zero rows...) by filtering the
lattice, not by rejecting examples.
"""

from __future__ import annotations

import functools
import inspect

from hypothesis import event, reject
from hypothesis import strategies as st

from . import lattice, regimes
from .cases import DeltaRuleCase, MixerCase, NearZeroRow, shape_case
from .segments import layout_features, segment_layouts

SEEDS = st.integers(0, 2**31 - 1)

# Norms that span sqrt(eps) = 1e-3 at the default eps = 1e-6.
TINY_NORMS = (1e-8, 1e-6, 1e-4, 1e-3, 3e-3, 1e-2)

# The conv width the delta-rule op's layouts are drawn for (it has no conv;
# K-1 = 3 is the mixer's usual short document).
DELTA_CONV_WIDTH = 4


def _packable(where):
    """`where` narrowed to the geometries packed cases draw from: T >= 2 (a
    T = 1 row is one token, document or padding: nothing to pack)."""
    return lambda geo: where(geo) and lattice.seq_len(geo["length"], geo["chunk"]) >= 2


def _spans_a_chunk_edge(geo) -> bool:
    """T >= C + 1: documents can start at, just before and just after a
    chunk edge. Packed cases draw these geometries twice as often."""
    return lattice.seq_len(geo["length"], geo["chunk"]) >= geo["chunk"] + 1


def _packed_segments(draw, packed, batch, seq_len, chunk, conv_width):
    """segments for a case: () unless packed (then nothing is drawn, so
    unpacked distributions are unchanged); packed draws a batch layout and
    emits an event per LAYOUT_FEATURES feature it has."""
    if not packed:
        return ()
    layouts = draw(segment_layouts(batch, seq_len, chunk, conv_width))
    for name in layout_features(layouts, chunk, conv_width):
        event(f"segments: {name}")
    return layouts


def _picked(rows, knobs, where) -> list:
    """The lattice rows passing `where`, reduced to the loaded profile's
    covering (lattice.PROFILE_COVERING)."""
    names = list(knobs)
    picked = [r for r in rows if where(dict(zip(names, r)))]
    return list(lattice.covering(tuple(picked), tuple(names), lattice.current_covering())) \
        if picked else []


def _geometries(rows, knobs, where, favour=None):
    """The lattice rows passing `where`, reduced to the loaded profile's
    covering (lattice.PROFILE_COVERING), as geometry dicts (none within the
    target's declared limits: the draw is rejected); rows passing
    `favour` too are listed twice (drawn twice as often), after the others
    so shrinking still heads for the first row."""
    names = list(knobs)
    picked = _picked(rows, knobs, where)
    if not picked:
        if lattice.declared_limits() is not None:
            reject()        # the target's limits leave this strategy no shape
        raise ValueError("no lattice geometry satisfies the filter")
    if favour is not None:
        picked += [r for r in picked if favour(dict(zip(names, r)))]
    return st.sampled_from(picked).map(lambda r: dict(zip(names, r)))


def _narrowed(where, packed, long_rows):
    """`where` narrowed as a case strategy narrows it: no LONG rows unless
    long_rows, T >= 2 when packed."""
    if not long_rows:
        short = where
        where = lambda geo: geo["length"] != lattice.LONG and short(geo)  # noqa: E731
    return _packable(where) if packed else where


def _draw_geometry(draw, rows, knobs, where, packed, long_rows=False):
    """(geometry dict, chunk C, sequence length T, (Hk, G, Dk, Dv), batch B)
    drawn from the lattice rows passing `where` (packed: T >= 2, T >= C+1
    favoured; long_rows: the lattice's LONG rows too)."""
    geo = draw(_geometries(rows, knobs, _narrowed(where, packed, long_rows),
                           favour=_spans_a_chunk_edge if packed else None))
    chunk = geo["chunk"]
    return geo, chunk, lattice.seq_len(geo["length"], chunk), geo["layout"], geo["batch"]


def _delta_shape(geo) -> dict:
    """The shape fields (cases.SHAPE_FIELDS) of a gated_delta_rule lattice row."""
    hk, group, dk, dv = geo["layout"]
    return dict(batch=geo["batch"], seq_len=lattice.seq_len(geo["length"], geo["chunk"]),
                k_heads=hk, group=group, dk=dk, dv=dv, chunk=geo["chunk"],
                dtype=geo["dtypes"][0], state_dtype=geo["dtypes"][1],
                has_initial_state=geo["initial_state"],
                scale=lattice.scale_of(geo["scale"], dk))


def _mixer_shape(geo) -> dict:
    """The shape fields (cases.SHAPE_FIELDS) of a mixer lattice row."""
    hk, group, dk, dv = geo["layout"]
    batch, seq_len, hv = geo["batch"], lattice.seq_len(geo["length"], geo["chunk"]), hk * group
    return dict(batch=batch, seq_len=seq_len, k_heads=hk, group=group, dk=dk, dv=dv,
                chunk=geo["chunk"], conv_width=geo["conv_width"], dtype=geo["dtypes"][0],
                param_dtype=geo["dtypes"][1],
                a_log_shape=lattice.param_shape(geo["a_log"], batch, seq_len, hv),
                dt_bias_shape=lattice.param_shape(geo["dt_bias"], batch, seq_len, hv),
                use_qk_norm=geo["qk_norm"], scale=lattice.scale_of(geo["scale"], dk))


def _delta_rows():
    return lattice.delta_geometries(lattice.declared_beyond_contract(),
                                    lattice.declared_limits(), lattice.declared_knob_values())


def _mixer_rows():
    return lattice.mixer_geometries(lattice.declared_beyond_contract(),
                                    lattice.declared_limits(), lattice.declared_knob_values())


def _delta_where(where, stable):
    """delta_rule_cases' filter: an unstable recurrence only on T <= 2C+1."""
    if stable:
        return where
    return lambda geo: (where(geo)
                        and lattice.seq_len(geo["length"], geo["chunk"]) <= 2 * geo["chunk"] + 1)


def delta_rule_shapes(*, where, stable, packed, long_rows, **_drawn_apart) -> list:
    """The shapes (cases.shape_case) delta_rule_cases with these arguments
    (all of them: yields binds its defaults) draws its cases on, in the
    loaded profile and the declared lattice."""
    where = _narrowed(_delta_where(where, stable), packed, long_rows)
    names = list(lattice.DELTA_KNOBS)
    return [shape_case(DeltaRuleCase, **_delta_shape(dict(zip(names, r))))
            for r in _picked(_delta_rows(), lattice.DELTA_KNOBS, where)]


def mixer_shapes(*, where, packed, long_rows, **_drawn_apart) -> list:
    """The shapes (cases.shape_case) mixer_cases with these arguments (all
    of them: yields binds its defaults) draws its cases on, in the loaded
    profile and the declared lattice."""
    where = _narrowed(where, packed, long_rows)
    names = list(lattice.MIXER_KNOBS)
    return [shape_case(MixerCase, **_mixer_shape(dict(zip(names, r))))
            for r in _picked(_mixer_rows(), lattice.MIXER_KNOBS, where)]


def yields(case_type, shapes=None):
    """Mark a case strategy constructor: every strategy it builds draws
    cases of case_type alone, said by its `case_type` attribute (the
    registry reads it: what every case of a property asks of a target,
    verification/engine/registry.py Property.not_checkable); shapes(**every
    argument of the constructor, its defaults bound): the shapes its cases
    are drawn on, as its `shape_cases()` (verification/engine/claims.py
    rules out a claim no shape meets before any draw)."""
    def mark(constructor):
        signature = inspect.signature(constructor)

        @functools.wraps(constructor)
        def build(**kwargs):
            strategy = constructor(**kwargs)
            strategy.case_type = case_type
            if shapes is not None:
                arguments = signature.bind(**kwargs)
                arguments.apply_defaults()
                strategy.shape_cases = functools.partial(shapes, **arguments.arguments)
            return strategy
        return build
    return mark


def _event_geometry(geo, length):
    event(f"T={geo['length']} (C={geo['chunk']})")
    event(f"dtypes {geo['dtypes'][0]}/{geo['dtypes'][1]}")
    hk, group, dk, dv = geo["layout"]
    event(f"G={group}; Dk{'=' if dk == dv else '!='}Dv")
    event(f"scale {geo['scale']:g} x Dk**-0.5")


@yields(DeltaRuleCase, delta_rule_shapes)
@st.composite
def delta_rule_cases(draw, *, where=lambda geo: True, gate_regimes=regimes.GATE_REGIMES,
                     beta_regimes=regimes.BETA_REGIMES, stable=True, zero_rows=None,
                     packed=False, long_rows=False):
    """A DeltaRuleCase from the gated_delta_rule lattice.

    where: filter on the geometry dict (keys of lattice.DELTA_KNOBS).
    stable=True: unit keys, beta |k|^2 <= 1; stable=False: |k|^2 in 2.6..4
    (expanding recurrence) and T <= 2C+1. zero_rows: None draws 0..2
    all-zero q/k rows, True forces at least one, False none. packed=True:
    T >= 2 (T >= C+1 favoured) and a drawn segment layout
    (strategies.segments, K = 4); packed=False: segments=(). long_rows:
    the lattice's rows of lattice.LONG_TOKENS bfloat16 tokens too (in the
    "pairs" coverings)."""
    geo, chunk, seq_len, (hk, group, dk, dv), batch = _draw_geometry(
        draw, _delta_rows(), lattice.DELTA_KNOBS, _delta_where(where, stable), packed, long_rows)
    n_zero = draw(st.integers(1 if zero_rows else 0, 0 if zero_rows is False else 2))
    rows = tuple(draw(st.tuples(st.sampled_from(("q", "k")), st.integers(0, batch - 1),
                                st.integers(0, seq_len - 1), st.integers(0, hk - 1)))
                 for _ in range(n_zero))
    case = DeltaRuleCase(
        **_delta_shape(geo), seed=draw(SEEDS),
        gate_regime=draw(st.sampled_from(gate_regimes)),
        beta_regime=draw(st.sampled_from(beta_regimes)),
        key_norm=1.0 if stable else draw(st.sampled_from((1.6, 1.8, 2.0))),
        zero_rows=rows,
        segments=_packed_segments(draw, packed, batch, seq_len, chunk, DELTA_CONV_WIDTH),
        # drawn last: a case's earlier draws are those it had before keys were
        # correlated (derandomized profiles keep their examples' shapes)
        key_cosine=draw(st.sampled_from(regimes.KEY_COSINES)),
        key_pair_cosine=draw(st.sampled_from(regimes.KEY_PAIR_COSINES)))
    _event_geometry(geo, seq_len)
    event(f"gate regime {case.gate_regime}; beta regime {case.beta_regime}; "
          f"key cosine {case.key_cosine}; key pair cosine {case.key_pair_cosine}")
    return case


@st.composite
def near_zero_rows(draw, batch, seq_len, k_heads, *, min_rows=0, max_rows=2,
                   exact_only=False):
    """0..max_rows q/k rows made (near) zero at the L2-norm input."""
    n = draw(st.integers(min_rows, max_rows))
    rows = []
    for _ in range(n):
        magnitude = 0.0 if exact_only else draw(st.sampled_from((0.0,) + TINY_NORMS))
        rows.append(NearZeroRow(which=draw(st.sampled_from(("q", "k"))),
                                batch=draw(st.integers(0, batch - 1)),
                                token=draw(st.integers(0, seq_len - 1)),
                                head=draw(st.integers(0, k_heads - 1)),
                                magnitude=magnitude))
        event("near-zero row: " + ("exact zero" if magnitude == 0 else "tiny"))
    return tuple(rows)


@yields(MixerCase, mixer_shapes)
@st.composite
def mixer_cases(draw, *, where=lambda geo: True, gate_regimes=regimes.GATE_REGIMES,
                beta_regimes=regimes.BETA_REGIMES, near_zero=None, eps_values=(1e-6,),
                packed=False, long_rows=False):
    """A MixerCase from the mixer lattice.

    where: filter on the geometry dict (keys of lattice.MIXER_KNOBS).
    near_zero: None draws 0..2 (near-)zero q/k rows, True forces >= 1,
    False none. eps_values: the QK-norm eps values to draw from.
    packed=True: T >= 2 (T >= C+1 favoured) and a drawn segment layout
    (strategies.segments); packed=False: segments=(). long_rows: as for
    delta_rule_cases."""
    geo, chunk, seq_len, (hk, group, dk, dv), batch = _draw_geometry(
        draw, _mixer_rows(), lattice.MIXER_KNOBS, where, packed, long_rows)
    rows = draw(near_zero_rows(batch, seq_len, hk, min_rows=1 if near_zero else 0,
                               max_rows=0 if near_zero is False else 2))
    case = MixerCase(
        **_mixer_shape(geo), seed=draw(SEEDS),
        eps=draw(st.sampled_from(eps_values)),
        gate_regime=draw(st.sampled_from(gate_regimes)),
        beta_regime=draw(st.sampled_from(beta_regimes)), near_zero=rows,
        segments=_packed_segments(draw, packed, batch, seq_len, chunk, geo["conv_width"]))
    _event_geometry(geo, seq_len)
    event(f"a_log {geo['a_log']}; dt_bias {geo['dt_bias']}; qk_norm={geo['qk_norm']}")
    return case
