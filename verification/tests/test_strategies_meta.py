"""Meta-tests: the strategies produce what they claim (like array-api-tests'
meta_tests). No kernel runs here."""

import itertools
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import (case_from_json, case_to_json, delta_rule_cases, delta_rule_inputs,
                        mixer_cases, mixer_inputs, segment_ids_of)
from strategies import lattice, regimes
from strategies.composite import DELTA_CONV_WIDTH
from strategies.segments import (LAYOUT_FEATURES, documents, layout_features, padding_mask,
                                 segment_ids)

from .test_reference_segments import documents as documents_by_deletion


def _covers_all_pairs(knobs, rows):
    names = list(knobs)
    for a, b in itertools.combinations(range(len(names)), 2):
        seen = {(r[a], r[b]) for r in rows}
        for va in knobs[names[a]]:
            for vb in knobs[names[b]]:
                assert (va, vb) in seen, f"pair {names[a]}={va}, {names[b]}={vb} never drawn"


def test_mixer_lattice_covers_every_pair_of_knob_values():
    _covers_all_pairs(lattice.MIXER_KNOBS, lattice.mixer_geometries())
    assert len(lattice.mixer_geometries()) <= 70       # bounded compile count


def test_delta_lattice_covers_every_pair_of_knob_values():
    _covers_all_pairs(lattice.DELTA_KNOBS, lattice.delta_geometries())
    assert len(lattice.delta_geometries()) <= 45


def test_the_dev_covering_holds_every_knob_value_in_a_few_rows():
    """The dev profile's compile budget: every value of every knob (each
    boundary length, layout, dtype pair, parameter rank, and the field chunk
    size 128 of the rows appended to the all-pairs rows) in <= 11 rows; the
    LONG rows are the gate's alone."""
    for knobs, rows in ((lattice.MIXER_KNOBS, lattice.mixer_geometries()),
                        (lattice.DELTA_KNOBS, lattice.delta_geometries())):
        names = tuple(knobs)
        dev = lattice.covering(rows, names, lattice.PROFILE_COVERING["dev"])
        assert dev[0] == rows[0] and set(dev) <= set(rows) and len(dev) <= 11
        assert lattice.LONG in {r[1] for r in rows} and lattice.LONG not in {r[1] for r in dev}
        rows = tuple(r for r in rows if r[1] != lattice.LONG)
        for i, name in enumerate(names):
            assert {r[i] for r in dev} == {r[i] for r in rows} >= set(knobs[name]), name
            meaningful = lattice.MEANINGFUL.get(name, lambda row: True)

            def where_meaningful(some_rows):
                return {r[i] for r in some_rows if meaningful(dict(zip(names, r)))}
            assert where_meaningful(dev) == where_meaningful(rows), name
        assert lattice.covering(rows, names, lattice.PROFILE_COVERING["ci"]) == rows
        assert lattice.covering(rows, names, "values") == dev
    # a property's filter keeps every value it admits
    narrow = tuple(r for r in lattice.delta_geometries() if r[4] == ("float32", "float32"))
    dev = lattice.covering(narrow, tuple(lattice.DELTA_KNOBS), "values")
    assert {r[1] for r in dev} == set(lattice.LENGTH_KINDS)


def test_each_profile_draws_from_its_covering():
    names = tuple(lattice.DELTA_KNOBS)
    previous = settings.get_current_profile_name()
    for profile, kind in lattice.PROFILE_COVERING.items():
        allowed = lattice.covering(lattice.delta_geometries(), names, kind)
        geometries = {(r[0], lattice.seq_len(r[1], r[0]), *r[2], r[3], *r[4], r[5])
                      for r in allowed}
        drawn = set()

        @settings(max_examples=40, deadline=None, database=None, derandomize=True)
        @given(delta_rule_cases())
        def draw(case):
            drawn.add((case.chunk, case.seq_len, case.k_heads, case.group, case.dk, case.dv,
                       case.batch, case.dtype, case.state_dtype, case.has_initial_state))

        settings.load_profile(profile)
        try:
            draw()
        finally:
            settings.load_profile(previous)
        assert drawn <= geometries, (profile, drawn - geometries)
        assert len(drawn) >= min(len(geometries), 5), profile


def test_lattice_lengths_hit_every_chunk_boundary():
    for chunk in lattice.CHUNK_SIZES:
        lengths = {lattice.seq_len(kind, chunk) for kind in lattice.LENGTH_KINDS}
        assert {1, chunk - 1, chunk, chunk + 1, 2 * chunk + 1} <= lengths
        assert lattice.seq_len("free", chunk) % chunk not in (0, 1, chunk - 1)


def test_param_kinds_cover_every_rank_and_broadcast_axis():
    shapes = {lattice.param_shape(k, 2, 7, 4) for k in lattice.PARAM_KINDS}
    assert {(4,), (1, 4), (2, 4), (2, 1, 4), (1, 7, 4), (2, 7, 4), (1, 1, 4)} == shapes


def _conv_silu(x, w):
    k = w.shape[0]
    xp = np.concatenate([np.zeros((x.shape[0], k - 1, x.shape[2])), x.astype(np.float64)], 1)
    pre = sum(w[j].astype(np.float64) * xp[:, j:j + x.shape[1]] for j in range(k))
    return pre / (1 + np.exp(-pre))


@settings(max_examples=60, deadline=None)
@given(mixer_cases(near_zero=True))
def test_near_zero_rows_are_zero_or_tiny_after_conv_and_silu(case):
    arrays = mixer_inputs(case)
    y = _conv_silu(arrays["x"], arrays["conv_weight"])
    for row in case.near_zero:
        offset = 0 if row.which == "q" else case.k_heads * case.dk
        c0 = offset + row.head * case.dk
        norm = np.linalg.norm(y[row.batch, row.token, c0:c0 + case.dk])
        if row.magnitude == 0:
            assert norm == 0.0
            continue
        overlapped = [r for r in case.near_zero if r is not row and r.which == row.which
                      and r.batch == row.batch and r.head == row.head
                      and abs(r.token - row.token) < case.conv_width]
        if not overlapped:   # another row's window may rewrite these taps
            assert 0.05 * row.magnitude <= norm <= 10 * row.magnitude * np.sqrt(case.dk)


@settings(max_examples=80, deadline=None)
@given(delta_rule_cases())
def test_delta_rule_regimes_hold(case):
    a = delta_rule_inputs(case)
    g, beta = a["g"].astype(np.float64), a["beta"].astype(np.float64)
    assert np.all(g <= 0)
    if case.gate_regime == "no_decay":
        assert np.all(g == 0)
    if case.gate_regime == "strong_decay":
        assert np.all((g < -68) & (g > -72))
    if case.beta_regime == "zero":
        assert np.all(beta < 1e-6)
    if case.beta_regime == "one":
        assert np.all(beta > 1 - 1e-6)
    k = a["k"].astype(np.float64)
    assert np.all(np.sum(k * k, -1).repeat(case.group, -1) * beta <= 2 + 1e-2)   # stable
    for which, b, t, h in case.zero_rows:
        assert np.all(a[which][b, t, h] == 0)
    assert a["q"].dtype.name == case.dtype
    assert (a["initial_state"] is None) == (not case.has_initial_state)


@settings(max_examples=40, deadline=None)
@given(delta_rule_cases(stable=False))
def test_unstable_cases_expand(case):
    a = delta_rule_inputs(case)
    k = a["k"].astype(np.float64)
    norms = np.sum(k * k, -1)
    for which, b, t, h in case.zero_rows:
        if which == "k":
            norms[b, t, h] = np.inf
    assert np.all(norms > 2.0)
    assert case.seq_len <= 2 * case.chunk + 1


@settings(max_examples=60, deadline=None)
@given(mixer_cases())
def test_mixer_gate_regimes_hold(case):
    a = mixer_inputs(case)
    a_log = a["a_log"].astype(np.float64)
    a_log = a_log[None, None] if a_log.ndim == 1 else (a_log[:, None] if a_log.ndim == 2 else a_log)
    dt = a["dt_bias"].astype(np.float64)
    dt = dt[None, None] if dt.ndim == 1 else (dt[:, None] if dt.ndim == 2 else dt)
    z = a["a"].astype(np.float64) + dt
    g = -np.exp(a_log) * np.logaddexp(z, 0).astype(np.float32)
    if case.gate_regime == "no_decay":
        assert np.all(np.logaddexp(z.astype(np.float32), np.float32(0)) == 0)
    if case.gate_regime == "strong_decay":
        assert np.all(g < -50)
    if case.gate_regime == "large_a_log":
        assert np.all(a_log > regimes.LARGE_A_LOG - 0.6)
    assert a["a_log"].shape == case.a_log_shape and a["dt_bias"].shape == case.dt_bias_shape
    assert a["x"].dtype.name == case.dtype and a["conv_weight"].dtype.name == case.param_dtype


@settings(max_examples=60, deadline=None)
@given(st.one_of(mixer_cases(), delta_rule_cases()))
def test_cases_round_trip_through_json_and_rebuild_identically(case):
    text = json.dumps(case_to_json(case))
    again = case_from_json(json.loads(text))
    assert again == case
    assert case.segments == () and segment_ids_of(case) is None
    assert "segments" not in text      # unpacked JSON is as before packing existed
    build = mixer_inputs if type(case).__name__ == "MixerCase" else delta_rule_inputs
    first, second = build(case), build(again)
    for name in first:
        if first[name] is None:
            assert second[name] is None
        else:
            assert np.array_equal(first[name].view(np.uint8), second[name].view(np.uint8))


# --- packed sequences (strategies.segments) ---------------------------------

def test_documents_follow_the_deletion_definition_table():
    table = [([1, 1, 2, 2, 1], [[0, 1], [2, 3], [4]]),
             ([1, 1, 0, 0, 1], [[0, 1, 4]]),
             ([0, 0, 0], []),
             ([0, 2, 2, 0], [[1, 2]]),
             ([3, 0, 5, 0, 3], [[0], [2], [4]]),
             ([7], [[0]])]
    for ids, expected in table:
        assert [d.tolist() for d in documents(np.array(ids))] == expected, ids


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12))
def test_documents_match_the_definition_token_by_token(ids):
    assert [d.tolist() for d in documents(np.array(ids, np.int32))] == documents_by_deletion(ids)


# Hand-written layouts (C = 16, K = 4) and exactly the features they have;
# together they have every feature.
FEATURE_TABLE = [
    # docs [2..15] len 14, [16, 20..22] len 4, [23..32] len 10
    ((((0, 2), (1, 14), (2, 1), (0, 3), (2, 3), (1, 10)),),
     {"boundary at a chunk edge", "boundary inside a chunk", "left padding",
      "padding inside a document", "id repeated in two documents"}),
    ((((5, 15), (0, 1), (6, 2)), ((0, 18),)),
     {"doc length C-1", "boundary at a chunk edge", "padding between documents",
      "all-padding row"}),
    ((((1, 17), (2, 1), (3, 3), (4, 16), (0, 3)),),
     {"doc length C+1", "doc length 1", "doc length K-1", "doc length C",
      "boundary one after a chunk edge", "boundary inside a chunk", "right padding"}),
    ((((1, 15), (2, 25)), ((7, 40),)),
     {"doc length C-1", "doc length > C+1", "boundary one before a chunk edge",
      "single document, no padding"}),
]


def test_layout_features_of_hand_written_layouts():
    for layouts, expected in FEATURE_TABLE:
        assert set(layout_features(layouts, 16, 4)) == expected, layouts
    assert set().union(*(e for _, e in FEATURE_TABLE)) == set(LAYOUT_FEATURES)


def _check_packed_case(case, conv_width):
    """A packed case is well formed; returns the features its layout has."""
    assert len(case.segments) == case.batch
    for row in case.segments:
        assert sum(length for _, length in row) == case.seq_len
        assert all(seg_id >= 0 and length >= 1 for seg_id, length in row)
        assert all(a[0] != b[0] for a, b in zip(row, row[1:]))      # runs are maximal
    ids = segment_ids_of(case)
    assert ids.shape == (case.batch, case.seq_len) and ids.dtype == np.int32
    assert np.array_equal(padding_mask(ids), ids == 0)
    for row in ids:                    # documents partition the non-padding tokens
        docs = documents(row)
        tokens = np.concatenate(docs) if docs else np.zeros(0, int)
        assert np.array_equal(tokens, np.flatnonzero(row))
    again = case_from_json(json.loads(json.dumps(case_to_json(case))))
    assert again == case and np.array_equal(segment_ids_of(again), ids)
    return layout_features(case.segments, case.chunk, conv_width)


def _reached_features(strategy, conv_width_of, draws):
    """The LAYOUT_FEATURES reached in `draws` derandomized draws (checking
    each case is well formed on the way)."""
    reached = set()

    @settings(max_examples=draws, derandomize=True, database=None, deadline=None)
    @given(strategy)
    def draw(case):
        reached.update(_check_packed_case(case, conv_width_of(case)))

    draw()
    return reached


def test_packed_delta_rule_cases_reach_every_layout_feature():
    reached = _reached_features(delta_rule_cases(packed=True), lambda c: DELTA_CONV_WIDTH, 150)
    assert reached == set(LAYOUT_FEATURES), f"never drawn: {set(LAYOUT_FEATURES) - reached}"


def test_packed_mixer_cases_reach_every_layout_feature():
    reached = _reached_features(mixer_cases(packed=True), lambda c: c.conv_width, 150)
    assert reached == set(LAYOUT_FEATURES), f"never drawn: {set(LAYOUT_FEATURES) - reached}"


def test_segment_ids_of_a_layout():
    ids = segment_ids((((0, 2), (3, 1)), ((1, 3),)))
    assert ids.dtype == np.int32 and ids.tolist() == [[0, 0, 3], [1, 1, 1]]
