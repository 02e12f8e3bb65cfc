"""Oracle self-tests for segment_ids (docs/contract.md section 6).

The oracle's segment path (`reference.token_scan` / `reference.reference_mixer`
with `segment_ids`) is compared with the deletion definition carried out
literally: padding deleted and documents cut in Python (`documents`), each
document run alone through the oracle's segment-free path, outputs put back,
zeros at padding. Gradients of both sides come from JAX autodiff, so the
comparison covers the VJP too. Padding positions hold NaN, +-inf and
+-1e300 (arbitrary values): a leak, even through a multiplication by a 0/1
mask, shows up as inf/NaN.

To compile once per op instead of once per layout, each document is its own
batch row ("slot") of one segment-free call: the document's tokens first,
then inert filler (zeros, so g = 0, beta = 0, k = 0). Causality keeps the
filler out of the document's outputs, and a filler token leaves the state
exactly unchanged, so a slot's final state is its document's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_kernels import reference

B, T, HK, HV, DK, DV, K = 2, 6, 2, 4, 2, 3, 4      # grouped heads: G = 2
C = 2 * HK * DK + HV * DV
SLOTS = B * T                                 # at most one document per token
SCALE = 0.7
POISON = np.array([np.nan, np.inf, -np.inf, 1e300, -1e300])
MIXER_KW = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV,
                use_qk_norm=True, eps=1e-6, scale=SCALE)
TOL = dict(rtol=1e-12, atol=1e-12)

LAYOUTS = {                                   # two rows of T=6 ids each
    "doc_changes": [[1, 1, 2, 2, 1, 1], [0, 0, 1, 1, 0, 2]],
    "inner_pad_and_empty_row": [[1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]],
    "left_pad_and_one_doc": [[0, 0, 0, 3, 3, 3], [1, 1, 1, 1, 1, 1]],
    "right_pad_and_alternating": [[2, 2, 2, 0, 0, 0], [5, 0, 7, 0, 5, 5]],
    "short_first_doc_and_window_over_pad": [[1, 2, 2, 2, 2, 2], [1, 1, 0, 0, 1, 1]],
}


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


# ------------------------------------------------------ the literal deletion
def documents(row_ids):
    """Index lists of a row's documents: padding deleted, then cut wherever
    the id changes between consecutive remaining tokens."""
    docs, prev = [], None
    for t, i in enumerate(row_ids):
        if i == 0:
            continue
        if i != prev:
            docs.append([])
        docs[-1].append(t)
        prev = i
    return docs


def document_slots(ids):
    """One slot per document of the layout ids [B][T]: row [S] and tok [S, T]
    (its row and token indices, the document first), valid [S, T] (a document
    token, not filler), first [S] (the row's first document), last [B] (slot
    of the row's last document; -1 when the row has none)."""
    row, tok = np.zeros(SLOTS, np.int32), np.zeros((SLOTS, T), np.int32)
    valid, first = np.zeros((SLOTS, T), bool), np.zeros(SLOTS, bool)
    last, n = np.full(B, -1, np.int32), 0
    for r, row_ids in enumerate(ids):
        for d, idx in enumerate(documents(row_ids)):
            row[n], tok[n, :len(idx)], valid[n, :len(idx)] = r, idx, True
            first[n], last[r], n = d == 0, n, n + 1
    return row, tok, valid, first, last


def _to_slots(u, row, tok, valid):
    """[B, T, ...] -> [S, T, ...]: each slot's document tokens, then zeros."""
    docs = u[row[:, None], tok]
    return jnp.where(valid.reshape(valid.shape + (1,) * (u.ndim - 2)), docs, 0.0)


def _from_slots(o, row, tok, valid):
    """[S, T, ...] -> [B, T, ...]: document outputs back in place, 0 elsewhere."""
    o = jnp.where(valid.reshape(valid.shape + (1,) * (o.ndim - 2)), o, 0.0)
    return jnp.zeros((B,) + o.shape[1:], o.dtype).at[row[:, None], tok].add(o)


def deleted_token_scan(slots, q, k, v, g, beta, s0):
    """token_scan by the deletion definition: the row's first document from
    s0, later ones from zeros; final state of the row's last document."""
    row, tok, valid, first, last = slots
    docs = [_to_slots(u, row, tok, valid) for u in (q, k, v, g, beta)]
    s_in = jnp.where(first[:, None, None, None], s0[row], 0.0)
    o_docs, s_docs = reference.token_scan(*docs, SCALE, s_in)
    s_final = jnp.where((last >= 0)[:, None, None, None], s_docs[last], s0)
    return _from_slots(o_docs, row, tok, valid), s_final


def _per_token(p):
    """A gate parameter [Hv], [B', Hv] or [B', T', Hv] broadcast to [B, T, Hv]."""
    p = p[None, None] if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)
    return jnp.broadcast_to(p, (B, T, HV))


def deleted_mixer(slots, x, w, a, b, a_log, dt_bias):
    """reference_mixer by the deletion definition (every document from a zero
    conv history and a zero state: the mixer has no state input)."""
    row, tok, valid, _, _ = slots
    per_token = (x, a, b, _per_token(a_log), _per_token(dt_bias))
    xd, ad, bd, a_log_d, dt_bias_d = [_to_slots(u, row, tok, valid) for u in per_token]
    o_docs = reference.reference_mixer(xd, w, ad, bd, a_log_d, dt_bias_d, **MIXER_KW)
    return _from_slots(o_docs, row, tok, valid)


# ------------------------------------------------------------------ runners
def outputs_and_grads(fn, args, cts):
    """fn's outputs and the cotangents of all args under output cotangents cts."""
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(cts)


@jax.jit
def oracle_token_scan(segment_ids, args, cts):
    fn = lambda *a: reference.token_scan(*a[:5], SCALE, a[5], segment_ids=segment_ids)
    return outputs_and_grads(fn, args, cts)


@jax.jit
def oracle_mixer(segment_ids, args, cts):
    fn = lambda *a: reference.reference_mixer(*a, segment_ids=segment_ids, **MIXER_KW)
    return outputs_and_grads(fn, args, cts)


@jax.jit
def deletion_token_scan(slots, args, cts):
    return outputs_and_grads(lambda *a: deleted_token_scan(slots, *a), args, cts)


@jax.jit
def deletion_mixer(slots, args, cts):
    return outputs_and_grads(lambda *a: deleted_mixer(slots, *a), args, cts)


# ------------------------------------------------------------------- inputs
def _poison_padding(arrays, pad, rng):
    """Per-token arrays [B, T, ...] get NaN, +-inf or +-1e300 at padding."""
    out = []
    for u in arrays:
        mask = pad.reshape(pad.shape + (1,) * (u.ndim - 2))
        out.append(np.where(mask, rng.choice(POISON, size=u.shape), u))
    return out


def delta_inputs(ids, seed=0):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, B, T, HK, DK))
    v = rng.normal(size=(B, T, HV, DV))
    g = -rng.uniform(0.05, 1.0, size=(B, T, HV))
    beta = rng.uniform(0.0, 1.0, size=(B, T, HV))
    s0 = rng.normal(size=(B, HV, DK, DV))
    pad = np.asarray(ids) == 0
    args = (*_poison_padding((q, k, v, g, beta), pad, rng), s0)
    cts = (rng.normal(size=(B, T, HV, DV)), rng.normal(size=(B, HV, DK, DV)))
    return args, cts


def mixer_inputs(ids, per_token_a_log, seed=1):
    """a_log [B, T, Hv] and dt_bias [Hv], or a_log [B, Hv] and dt_bias [1, T, Hv]."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, C))
    w = rng.normal(size=(K, C)) * 0.5
    a, b = rng.normal(size=(2, B, T, HV))
    if per_token_a_log:
        a_log, dt_bias = rng.normal(size=(B, T, HV)) * 0.5, rng.normal(size=(HV,))
    else:
        a_log, dt_bias = rng.normal(size=(B, HV)) * 0.5, rng.normal(size=(1, T, HV))
    pad = np.asarray(ids) == 0
    x, a, b = _poison_padding((x, a, b), pad, rng)
    if per_token_a_log:
        (a_log,) = _poison_padding((a_log,), pad, rng)
    return (x, w, a, b, a_log, dt_bias), rng.normal(size=(B, T, HV, DV))


def _assert_zero_at_padding(name, grad, pad):
    assert np.all(np.asarray(grad)[pad] == 0.0), f"{name} is not exactly 0 at padding"


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_scan_is_the_deletion_definition(layout):
    ids = LAYOUTS[layout]
    pad = np.asarray(ids) == 0
    args, cts = delta_inputs(ids)
    (o, s), grads = oracle_token_scan(np.asarray(ids, np.int32), args, cts)
    (o_ref, s_ref), grads_ref = deletion_token_scan(document_slots(ids), args, cts)

    np.testing.assert_allclose(o, o_ref, **TOL)
    np.testing.assert_allclose(s, s_ref, **TOL)
    assert np.all(np.asarray(o)[pad] == 0.0)
    _assert_gradients_match(("q", "k", "v", "g", "beta", "initial_state"), grads, grads_ref,
                            pad, zero_at_padding=("q", "k", "v", "g", "beta"))
    for r in np.flatnonzero(pad.all(axis=1)):     # no document: state passes through
        assert np.array_equal(s[r], args[5][r])
        assert np.array_equal(grads[5][r], cts[1][r])


def _assert_gradients_match(names, grads, grads_ref, pad, zero_at_padding):
    """Each gradient finite and equal to the deletion definition's; those
    named in zero_at_padding exactly 0 at padding tokens."""
    for name, gr, gr_ref in zip(names, grads, grads_ref):
        assert np.all(np.isfinite(gr)), name
        np.testing.assert_allclose(gr, gr_ref, **TOL, err_msg=name)
        if name in zero_at_padding:
            _assert_zero_at_padding(name, gr, pad)


@pytest.mark.parametrize("layout, per_token_a_log", [
    ("doc_changes", True),
    ("inner_pad_and_empty_row", True),
    ("left_pad_and_one_doc", False),
    ("right_pad_and_alternating", True),
    ("short_first_doc_and_window_over_pad", True),
])
def test_mixer_is_the_deletion_definition(layout, per_token_a_log):
    ids = LAYOUTS[layout]
    pad = np.asarray(ids) == 0
    args, cts = mixer_inputs(ids, per_token_a_log)
    o, grads = oracle_mixer(np.asarray(ids, np.int32), args, cts)
    o_ref, grads_ref = deletion_mixer(document_slots(ids), args, cts)

    np.testing.assert_allclose(o, o_ref, **TOL)
    assert np.all(np.asarray(o)[pad] == 0.0)
    _assert_gradients_match(("x", "conv_weight", "a", "b", "a_log", "dt_bias"), grads,
                            grads_ref, pad, zero_at_padding=("x", "a", "b") + (
                                ("a_log",) if per_token_a_log else ()))


def test_window_reaches_over_padding_not_across_documents():
    """ids 1,1,0,0,1,1 is one document (same outputs as 1,1,1,1 with the
    padding deleted); 1,1,0,0,2,2 is two."""
    args, cts = mixer_inputs([[1] * T] * B, per_token_a_log=False)
    one, _ = oracle_mixer(np.array([[1, 1, 0, 0, 1, 1]] * B, np.int32), args, cts)
    two, _ = oracle_mixer(np.array([[1, 1, 0, 0, 2, 2]] * B, np.int32), args, cts)
    keep = [0, 1, 4, 5]
    x, w, a, b, a_log, dt_bias = args
    packed = reference.reference_mixer(x[:, keep], w, a[:, keep], b[:, keep], a_log,
                                       dt_bias[:, keep], **MIXER_KW)
    np.testing.assert_allclose(np.asarray(one)[:, keep], packed, **TOL)
    assert not np.allclose(np.asarray(two)[:, 4:], np.asarray(one)[:, 4:])


def test_no_segment_ids_equals_all_ones():
    ones = np.ones((B, T), np.int32)
    args, cts = delta_inputs(ones)
    (o1, s1), _ = oracle_token_scan(ones, args, cts)
    o0, s0 = reference.token_scan(*args[:5], SCALE, args[5])
    np.testing.assert_allclose(o1, o0, **TOL)
    np.testing.assert_allclose(s1, s0, **TOL)
    margs, mcts = mixer_inputs(ones, per_token_a_log=True)
    m1, _ = oracle_mixer(ones, margs, mcts)
    np.testing.assert_allclose(m1, reference.reference_mixer(*margs, **MIXER_KW), **TOL)


def test_float32_without_x64():
    """The segment path runs in float32 (x64 off) and agrees with float64."""
    ids = LAYOUTS["doc_changes"]
    args, _ = delta_inputs(ids)
    margs, _ = mixer_inputs(ids, per_token_a_log=True)
    o64, s64 = reference.token_scan(*args[:5], SCALE, args[5], segment_ids=np.asarray(ids))
    m64 = reference.reference_mixer(*margs, segment_ids=np.asarray(ids), **MIXER_KW)
    with jax.enable_x64(False), np.errstate(over="ignore"):     # 1e300 -> inf at padding
        f32 = [u.astype(np.float32) for u in args]
        mf32 = [u.astype(np.float32) for u in margs]
        o, s = reference.token_scan(*f32[:5], SCALE, f32[5],
                                    segment_ids=jnp.asarray(ids, jnp.int32))
        m = reference.reference_mixer(*mf32, segment_ids=jnp.asarray(ids, jnp.int32),
                                      **MIXER_KW)
    assert o.dtype == s.dtype == m.dtype == jnp.float32
    for got, want in ((o, o64), (s, s64), (m, m64)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
