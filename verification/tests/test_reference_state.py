"""Oracle self-tests for carried state (docs/contract.md section 7).

`reference.reference_mixer` with `state=` / `return_state=` is checked, in
float64, against:
- the stateless oracle (state=None is today's computation, bit for bit);
- split invariance: a call on x[:, :T1] then one on x[:, T1:] with the state
  the first returned equals one call (outputs, conv and recurrent state),
  decode (a prompt, then single-token calls) included;
- `literal_mixer`, the contract's formulas written token by token in numpy
  (window = [history..., x_t], conv, silu, split, norm, gates, delta step),
  with the deletion definition of section 6 for packed rows;
- central finite differences for the gradients w.r.t. the incoming state and
  through the returned state.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_kernels import reference
from gdn_kernels.state import GDNState

from .test_reference_segments import documents  # the literal deletion, section 6

B, T = 2, 9
DIMS = (2, 4, 3, 2)                 # Hk, Hv, Dk, Dv: grouped heads (G = 2), Dk != Dv
SCALE, EPS = 0.7, 1e-6
TOL = dict(rtol=1e-12, atol=1e-12)
POISON = np.array([np.nan, np.inf, -np.inf, 1e300, -1e300])


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def channels(dims):
    hk, hv, dk, dv = dims
    return 2 * hk * dk + hv * dv


def mixer_kw(dims, use_qk_norm=True):
    hk, hv, dk, dv = dims
    return dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv,
                use_qk_norm=use_qk_norm, eps=EPS, scale=SCALE)


@functools.partial(jax.jit, static_argnames=("dims", "use_qk_norm"))
def mixer(args, state, segment_ids=None, *, dims=DIMS, use_qk_norm=True):
    """The oracle with return_state=True: (o [B, T, Hv, Dv], GDNState)."""
    return reference.reference_mixer(*args, segment_ids=segment_ids, state=state,
                                     return_state=True, **mixer_kw(dims, use_qk_norm))


# ------------------------------------------------------------------- inputs
def inputs(K, t=T, dims=DIMS, seed=0, a_log_shape="BTH"):
    """(x [B, t, C], w [K, C], a, b [B, t, Hv], a_log, dt_bias [Hv]);
    a_log is [B, t, Hv] ("BTH") or [B, Hv] ("BH")."""
    rng = np.random.default_rng(seed)
    hv = dims[1]
    x = rng.normal(size=(B, t, channels(dims)))
    w = rng.normal(size=(K, channels(dims))) * 0.5
    a, b = rng.normal(size=(2, B, t, hv))
    a_log = rng.normal(size=(B, t, hv) if a_log_shape == "BTH" else (B, hv)) * 0.5
    return x, w, a, b, a_log, rng.normal(size=(hv,))


def random_state(K, dims=DIMS, seed=1):
    """GDNState(conv [B, K-1, C], recurrent [B, Hv, Dk, Dv]), nonzero."""
    rng = np.random.default_rng(seed)
    _, hv, dk, dv = dims
    return GDNState(conv=rng.normal(size=(B, K - 1, channels(dims))),
                    recurrent=rng.normal(size=(B, hv, dk, dv)) * 0.5)


def time_slice(args, sl):
    """The per-token arguments (x, a, b and a [B, T, Hv] a_log) cut along time."""
    x, w, a, b, a_log, dt_bias = args
    a_log = a_log[:, sl] if a_log.ndim == 3 else a_log
    return x[:, sl], w, a[:, sl], b[:, sl], a_log, dt_bias


def poison_padding(args, ids, seed=2):
    """x, a, b (and a [B, T, Hv] a_log) get NaN, +-inf or +-1e300 at padding."""
    rng = np.random.default_rng(seed)
    pad = np.asarray(ids) == 0
    out = list(args)
    for i in (0, 2, 3, 4):
        if out[i].ndim == 3:
            out[i] = np.where(pad[..., None], rng.choice(POISON, size=out[i].shape), out[i])
    return tuple(out)


def assert_same(got, want, msg=""):
    (o, st), (o_ref, st_ref) = got, want
    np.testing.assert_allclose(o, o_ref, **TOL, err_msg=f"o {msg}")
    np.testing.assert_allclose(st.conv, st_ref.conv, **TOL, err_msg=f"conv {msg}")
    np.testing.assert_allclose(st.recurrent, st_ref.recurrent, **TOL,
                               err_msg=f"recurrent {msg}")


def split_call(args, state, t1, ids=None, **kw):
    """Calls on [:t1] then [t1:] with the state the first returned."""
    ids1, ids2 = (None, None) if ids is None else (ids[:, :t1], ids[:, t1:])
    o1, st1 = mixer(time_slice(args, slice(None, t1)), state, ids1, **kw)
    o2, st2 = mixer(time_slice(args, slice(t1, None)), st1, ids2, **kw)
    return jnp.concatenate([o1, o2], axis=1), st2


# ------------------------------------------------- the literal definition
def _per_token(p, t, hv):
    """Gate parameter [Hv], [B', Hv] or [B', T', Hv] -> [B, T, Hv] (section 2)."""
    p = p[None, None] if p.ndim == 1 else (p[:, None] if p.ndim == 2 else p)
    return np.broadcast_to(p, (B, t, hv))


def literal_mixer(args, state, ids=None, dims=DIMS, use_qk_norm=True):
    """The contract's mixer, token by token in numpy float64. A row's first
    document starts from `state` (zeros when None), later ones from zeros;
    the returned state is after the row's last document (the incoming one
    for a row without documents). Returns (o, conv, recurrent)."""
    x, w, a, b, a_log, dt_bias = (np.asarray(u, np.float64) for u in args)
    hk, hv, dk, dv = dims
    group, nq, kw = hv // hk, hk * dk, w.shape[0]
    t_len = x.shape[1]
    a_log, dt_bias = _per_token(a_log, t_len, hv), _per_token(dt_bias, t_len, hv)
    if state is None:
        state = GDNState(np.zeros((B, kw - 1, x.shape[2])), np.zeros((B, hv, dk, dv)))
    conv0, rec0 = np.asarray(state.conv), np.asarray(state.recurrent)
    o = np.zeros((B, t_len, hv, dv))
    conv_out, rec_out = conv0.copy(), rec0.copy()
    for r in range(B):
        row_ids = [1] * t_len if ids is None else list(np.asarray(ids)[r])
        for d, idx in enumerate(documents(row_ids)):
            hist = conv0[r].copy() if d == 0 else np.zeros_like(conv0[r])   # [K-1, C]
            s = rec0[r].copy() if d == 0 else np.zeros_like(rec0[r])        # [Hv, Dk, Dv]
            for t in idx:
                window = np.concatenate([hist, x[r, t][None]], axis=0)     # [K, C]
                pre = np.sum(w * window, axis=0)
                y = pre / (1.0 + np.exp(-pre))
                q = y[:nq].reshape(hk, dk)
                k = y[nq:2 * nq].reshape(hk, dk)
                v = y[2 * nq:].reshape(hv, dv)
                if use_qk_norm:
                    q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + EPS)
                    k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + EPS)
                g = -np.exp(a_log[r, t]) * np.logaddexp(0.0, a[r, t] + dt_bias[r, t])
                beta = 1.0 / (1.0 + np.exp(-b[r, t]))
                for h in range(hv):
                    kh, qh = k[h // group], q[h // group]
                    s_dec = np.exp(g[h]) * s[h]
                    s[h] = s_dec + np.outer(kh, beta[h] * (v[h] - s_dec.T @ kh))
                    o[r, t, h] = SCALE * s[h].T @ qh
                hist = window[1:]
            conv_out[r], rec_out[r] = hist, s
    return o, conv_out, rec_out


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("packed", [False, True])
def test_no_state_is_the_stateless_oracle(K, packed):
    """state=None: o is bitwise the stateless computation, with or without
    return_state; the returned state is the last K-1 inputs and the scan's
    final state. A zero state gives the same (bitwise on the packed path)."""
    args = inputs(K)
    x, w, a, b, a_log, dt_bias = args
    kw = mixer_kw(DIMS)
    ids = np.array([[1, 1, 2, 2, 2, 0, 3, 3, 0], [0, 4, 4, 4, 4, 4, 4, 4, 4]]) if packed else None
    o = reference.reference_mixer(*args, segment_ids=ids, **kw)
    o_rs, st = reference.reference_mixer(*args, segment_ids=ids, return_state=True, **kw)
    assert np.array_equal(o_rs, o)
    zero = GDNState(np.zeros((B, K - 1, channels(DIMS))), np.zeros((B,) + DIMS[1:]))
    o_z, st_z = reference.reference_mixer(*args, segment_ids=ids, state=zero,
                                          return_state=True, **kw)
    if packed:
        assert np.array_equal(o_z, o)
        assert np.array_equal(st_z.conv, st.conv)
        assert np.array_equal(st_z.recurrent, st.recurrent)
        o_lit, conv_lit, rec_lit = literal_mixer(args, None, ids)
        np.testing.assert_allclose(o, o_lit, **TOL)
        np.testing.assert_allclose(st.conv, conv_lit, **TOL)
        np.testing.assert_allclose(st.recurrent, rec_lit, **TOL)
        return
    assert_same((o_z, st_z), (o, st))
    # today's stateless pipeline, stage by stage
    hk, hv, dk, dv = DIMS
    y = reference.reference_conv1d_silu(x, w)
    nq = hk * dk
    q = y[..., :nq].reshape(B, T, hk, dk)
    k = y[..., nq:2 * nq].reshape(B, T, hk, dk)
    v = y[..., 2 * nq:].reshape(B, T, hv, dv)
    q = q / jnp.sqrt(jnp.sum(q * q, axis=-1, keepdims=True) + EPS)
    k = k / jnp.sqrt(jnp.sum(k * k, axis=-1, keepdims=True) + EPS)
    g = -jnp.exp(a_log) * jax.nn.softplus(a + dt_bias[None, None])
    o_old, s_old = reference.token_scan(q, k, v, g, jax.nn.sigmoid(b), SCALE)
    assert np.array_equal(o, o_old)
    assert np.array_equal(st.recurrent, s_old)
    assert np.array_equal(st.conv, x[:, T - (K - 1):])
    assert st.conv.shape == (B, K - 1, channels(DIMS))
    assert st.conv.dtype == x.dtype and st.recurrent.dtype == jnp.float64


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("incoming", ["none", "random"])
def test_split_invariance(K, incoming):
    """T = 9; T1 in {1, 2 (< K-1), 4, 7 (T2 < K-1), 8 (T2 = 1)} for K = 4."""
    args = inputs(K)
    state = None if incoming == "none" else random_state(K)
    whole = mixer(args, state)
    for t1 in (1, 2, 4, 7, 8) if K == 4 else (1, 4, 8):
        assert_same(split_call(args, state, t1), whole, f"T1={t1}")


@pytest.mark.parametrize("K, prompt", [(4, 1), (4, 5), (2, 3)])
def test_decode_equals_one_call(K, prompt):
    args = inputs(K, a_log_shape="BH")
    state = random_state(K)
    o_whole, st_whole = mixer(args, state)
    o, st = mixer(time_slice(args, slice(None, prompt)), state)
    outs = [o]
    for t in range(prompt, T):
        o, st = mixer(time_slice(args, slice(t, t + 1)), st)
        outs.append(o)
    assert_same((jnp.concatenate(outs, axis=1), st), (o_whole, st_whole))


@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("dims, use_qk_norm, a_log_shape", [
    (DIMS, True, "BTH"),
    ((1, 2, 4, 4), False, "BH"),
])
def test_literal_definition_with_state(K, dims, use_qk_norm, a_log_shape):
    args = inputs(K, dims=dims, a_log_shape=a_log_shape, seed=3)
    state = random_state(K, dims=dims, seed=4)
    o, st = mixer(args, state, dims=dims, use_qk_norm=use_qk_norm)
    o_lit, conv_lit, rec_lit = literal_mixer(args, state, dims=dims, use_qk_norm=use_qk_norm)
    np.testing.assert_allclose(o, o_lit, **TOL)
    np.testing.assert_allclose(st.conv, conv_lit, **TOL)
    np.testing.assert_allclose(st.recurrent, rec_lit, **TOL)
    # a short call keeps part of the old history (T < K-1)
    short = time_slice(args, slice(0, 1))
    o1, st1 = mixer(short, state, dims=dims, use_qk_norm=use_qk_norm)
    o_lit1, conv_lit1, rec_lit1 = literal_mixer(short, state, dims=dims,
                                                use_qk_norm=use_qk_norm)
    np.testing.assert_allclose(o1, o_lit1, **TOL)
    np.testing.assert_allclose(st1.conv, conv_lit1, **TOL)
    np.testing.assert_allclose(st1.conv, np.concatenate([state.conv, short[0]], 1)[:, 1:], **TOL)
    np.testing.assert_allclose(st1.recurrent, rec_lit1, **TOL)


PACKED_IDS = {   # row 1 of "two_docs_and_empty" has no document at all
    "two_docs_and_empty": [[1, 1, 0, 2, 2, 2, 2, 0, 2], [0] * T],
    "pad_inside_and_late_start": [[3, 0, 3, 3, 0, 0, 3, 3, 5], [0, 0, 0, 0, 7, 7, 7, 7, 0]],
}


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("layout", PACKED_IDS)
def test_packed_with_state(K, layout):
    ids = np.asarray(PACKED_IDS[layout], np.int32)
    args = poison_padding(inputs(K), ids)
    state = random_state(K)
    o, st = mixer(args, state, ids)
    o_lit, conv_lit, rec_lit = literal_mixer(args, state, ids)
    np.testing.assert_allclose(o, o_lit, **TOL)
    np.testing.assert_allclose(st.conv, conv_lit, **TOL)
    np.testing.assert_allclose(st.recurrent, rec_lit, **TOL)
    assert np.all(np.asarray(o)[ids == 0] == 0.0)

    # the state reaches the first document only
    o0, st0 = mixer(args, None, ids)
    for r in range(B):
        docs = documents(ids[r])
        if not docs:        # no document: the incoming state, bit for bit
            assert np.array_equal(st.conv[r], state.conv[r])
            assert np.array_equal(st.recurrent[r], state.recurrent[r])
            continue
        assert not np.allclose(o[r, docs[0]], o0[r, docs[0]])
        later = [t for d in docs[1:] for t in d]
        np.testing.assert_allclose(o[r, later], o0[r, later], **TOL)
        if len(docs) > 1:
            np.testing.assert_allclose(st.conv[r], st0.conv[r], **TOL)
            np.testing.assert_allclose(st.recurrent[r], st0.recurrent[r], **TOL)


@pytest.mark.parametrize("K", [2, 4])
def test_packed_split_inside_a_document(K):
    """Splits inside row 0's last document; row 1's first part is padding
    only (T1 = 4) or cuts its document."""
    ids = np.array([[1, 1, 0, 2, 2, 2, 2, 0, 2], [0, 0, 0, 0, 7, 7, 7, 7, 7]], np.int32)
    args = poison_padding(inputs(K), ids)
    state = random_state(K)
    whole = mixer(args, state, ids)
    for t1 in (4, 7, 8):    # row 0: inside doc 2 / [.., 2 | 0, 2] / [.., 0 | 2]
        assert_same(split_call(args, state, t1, ids), whole, f"T1={t1}")


def _fd_grad(f, u, h=1e-5):
    """Central differences of the scalar f at u (float64), entry by entry."""
    u = np.asarray(u, np.float64)
    grad = np.zeros_like(u)
    for i in np.ndindex(u.shape):
        e = np.zeros_like(u)
        e[i] = h
        grad[i] = (f(u + e) - f(u - e)) / (2 * h)
    return grad


@pytest.mark.parametrize("case", ["unpacked", "short", "packed"])
def test_state_gradients_match_finite_differences(case):
    """d loss / d state.conv and d state.recurrent, the loss reading o and the
    returned conv and recurrent state."""
    dims, K = (1, 2, 2, 2), 3
    t = 1 if case == "short" else 4            # short: T < K-1
    args = inputs(K, t=t, dims=dims, seed=5)
    state = random_state(K, dims=dims, seed=6)
    ids = np.array([[1, 1, 2, 2], [0, 0, 0, 0]], np.int32) if case == "packed" else None
    rng = np.random.default_rng(7)
    o, st = mixer(args, state, ids, dims=dims)
    cts = [rng.normal(size=u.shape) for u in (o, st.conv, st.recurrent)]

    @jax.jit
    def loss(conv, rec):
        o, st = reference.reference_mixer(*args, segment_ids=ids, state=GDNState(conv, rec),
                                          return_state=True, **mixer_kw(dims))
        return sum(jnp.sum(u * c) for u, c in zip((o, st.conv, st.recurrent), cts))

    d_conv, d_rec = jax.grad(loss, argnums=(0, 1))(state.conv, state.recurrent)
    fd_conv = _fd_grad(lambda c: float(loss(c, state.recurrent)), state.conv)
    fd_rec = _fd_grad(lambda r: float(loss(state.conv, r)), state.recurrent)
    for name, got, want in (("conv", d_conv, fd_conv), ("recurrent", d_rec, fd_rec)):
        err = np.max(np.abs(np.asarray(got) - want))
        assert err <= 1e-6 * np.max(np.abs(want)), (name, err)
    if case == "packed":     # row 1 has no document: the state passes through
        assert np.array_equal(d_conv[1], cts[1][1])
        assert np.array_equal(d_rec[1], cts[2][1])


def test_state_dtypes():
    """conv comes back in x's dtype, recurrent in the compute dtype; a float64
    state makes the compute dtype float64."""
    K = 4
    args = inputs(K)
    state = random_state(K)
    o64, st64 = mixer(args, state)
    args32 = tuple(u.astype(np.float32) for u in args)
    state32 = GDNState(*(u.astype(np.float32) for u in state))
    o, st = mixer(args32, GDNState(state32.conv, state.recurrent))
    assert o.dtype == st.conv.dtype == jnp.float32 and st.recurrent.dtype == jnp.float64
    with jax.enable_x64(False):
        o, st = mixer(args32, state32)
    assert o.dtype == st.conv.dtype == st.recurrent.dtype == jnp.float32
    np.testing.assert_allclose(o, o64, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st.recurrent, st64.recurrent, rtol=1e-4, atol=1e-5)
