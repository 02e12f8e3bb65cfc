"""The adapters (verification/targets/adapters.py, verification/targets/varlen.py) convert
and nothing else: a kernel written in each convention by converting the
oracle's inputs the other way round, once adapted, equals the oracle
(forward and every cotangent, packed rows included); the packed-row
conversions cut documents where the contract does; deviations are recorded,
not hidden; conventions that cannot carry a feature declare it unsupported.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_kernels import GDNState
from gdn_kernels.reference import reference_mixer, token_scan
from verification import adapt, mixer_from_core
from verification.targets import varlen
from verification.targets.adapters import Conventions, recording_deviations
from verification.targets.declaration import case_needs, unmet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(0)
B, T, HK, G, DK, DV = 2, 9, 1, 2, 4, 3
HV = HK * G
# row 0: leading padding, a document, padding, the same document again (one
# document), a new one; row 1: no document at all
IDS = np.array([[0, 1, 1, 0, 1, 2, 2, 0, 3],
                [0, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)


def _inputs():
    q = RNG.normal(size=(B, T, HK, DK)).astype(np.float32)
    k = RNG.normal(size=(B, T, HK, DK)).astype(np.float32)
    v = RNG.normal(size=(B, T, HV, DV)).astype(np.float32)
    g = -np.log1p(np.exp(RNG.normal(size=(B, T, HV)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-RNG.normal(size=(B, T, HV))))).astype(np.float32)
    s0 = RNG.normal(size=(B, HV, DK, DV)).astype(np.float32)
    return q, k, v, g, beta, s0


def test_kernel_sequences_cut_where_the_contract_does():
    seqs = varlen.kernel_sequences(IDS)
    np.testing.assert_array_equal(seqs.starts[0], [1, 0, 0, 0, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(seqs.doc_ids[0], [0, 0, 0, 0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(seqs.doc_ids[1], [0] * T)
    np.testing.assert_array_equal(seqs.cu_seqlens[:5], [0, 5, 8, 9, 18])
    assert (np.asarray(seqs.cu_seqlens[5:]) == B * T).all()    # unused: empty at the end
    np.testing.assert_array_equal(seqs.row_first, [0, 3])
    np.testing.assert_array_equal(seqs.row_last, [2, 3])


def test_kernel_ids_convert_back_to_segment_ids():
    seqs = varlen.kernel_sequences(IDS)
    flat = varlen.segment_ids_from_cu_seqlens(seqs.cu_seqlens, B * T)
    np.testing.assert_array_equal(flat[0], [1] * 5 + [2] * 3 + [3] + [4] * 9)
    np.testing.assert_array_equal(varlen.segment_ids_from_doc_ids(np.array([[0, 0, 3, 3, 0]])),
                                  [[1, 1, 2, 2, 3]])


def _oracle(q, k, v, g, beta, s0, ids=None, scale=None):
    return token_scan(q, k, v, g, beta, DK ** -0.5 if scale is None else scale, s0, ids)


def _head_first_kernel(q, k, v, alpha, beta_logit, *, initial_state):
    """The oracle in the other conventions: head-first, equal heads, a fixed
    scale, the decay as a factor, beta as a logit, the state [Dv, Dk]."""
    back = lambda x: jnp.swapaxes(x, 1, 2)                     # noqa: E731
    o, s = _oracle(back(q), back(k), back(v), jnp.log(back(alpha)),
                   jax.nn.sigmoid(back(beta_logit)), jnp.swapaxes(initial_state, -1, -2))
    return back(o), jnp.swapaxes(s, -1, -2)


def _doc_ids_kernel(q, k, v, g, beta, *, scale, initial_state=None, doc_ids=None, chunk_size=64):
    """The oracle with ids where 0 is an ordinary document."""
    ids = None if doc_ids is None else varlen.segment_ids_from_doc_ids(doc_ids)
    return _oracle(q, k, v, g, beta, initial_state, ids, scale)


def _vjp(fn, args, cts):
    out, pullback = jax.vjp(fn, *args)
    return out, pullback(cts)


def _assert_same(fn, ref, args):
    cts = (jnp.asarray(RNG.normal(size=(B, T, HV, DV)), jnp.float32),
           jnp.asarray(RNG.normal(size=(B, HV, DK, DV)), jnp.float32))
    out, grads = _vjp(fn, args, cts)
    want_out, want_grads = _vjp(ref, args, cts)
    for got, want in zip(out + grads, want_out + want_grads):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_head_first_factor_logit_vk_equal_heads_is_the_oracle():
    decl = adapt(_head_first_kernel, layout="head_first", heads="equal", scale="fixed",
                 decay="factor", beta="logit", state_layout="vk", varlen=None, chunk_size=None)
    args = _inputs()
    _assert_same(lambda *a: decl.gated_delta_rule(*a[:5], initial_state=a[5]),
                 lambda *a: _oracle(*a), args)
    assert len(decl.conventions) == 8 and not decl.supports.scale
    assert not decl.supports.saturated_beta and not decl.supports.segment_ids


def test_doc_ids_with_padding_is_the_oracle():
    decl = adapt(_doc_ids_kernel, varlen="doc_ids")
    args = _inputs()
    _assert_same(lambda *a: decl.gated_delta_rule(*a[:5], initial_state=a[5], segment_ids=IDS),
                 lambda *a: _oracle(*a, IDS), args)


def test_mixer_from_core_is_the_reference_mixer():
    decl = mixer_from_core(adapt(_doc_ids_kernel, varlen="doc_ids"))
    assert decl.mixer_label and decl.supports.carried_state
    c = 2 * HK * DK + HV * DV
    x = jnp.asarray(RNG.normal(size=(B, T, c)), jnp.float32)
    w = jnp.asarray(RNG.normal(size=(4, c)), jnp.float32)
    a, b = (jnp.asarray(RNG.normal(size=(B, T, HV)), jnp.float32) for _ in range(2))
    a_log, dt_bias = jnp.zeros((HV,)), jnp.zeros((B, HV))
    state = GDNState(jnp.asarray(RNG.normal(size=(B, 3, c)), jnp.float32),
                     jnp.asarray(RNG.normal(size=(B, HV, DK, DV)), jnp.float32))
    kw = dict(num_k_heads=HK, num_v_heads=HV, head_k_dim=DK, head_v_dim=DV, scale=None,
              segment_ids=IDS, state=state, return_state=True)
    got = decl.gdn_decoupled_conv1d(x, w, a, b, a_log, dt_bias, **kw)
    want = reference_mixer(x, w, a, b, a_log, dt_bias, use_qk_norm=True, eps=1e-6,
                           **dict(kw, scale=DK ** -0.5))
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(u, v, rtol=2e-5, atol=2e-5)


def test_a_cast_is_recorded_as_a_deviation():
    def bf16_state(q, k, v, g, beta, *, scale, initial_state, chunk_size):
        o, s = _oracle(q, k, v, g, beta, initial_state, scale=scale)
        return o, s.astype(jnp.bfloat16)

    decl = adapt(bf16_state, varlen=None)
    args = _inputs()
    with recording_deviations() as seen:
        out = jax.eval_shape(lambda *a: decl.gated_delta_rule(*a[:5], initial_state=a[5]),
                             *args)
    assert out[1].dtype == jnp.float32                    # cast for the other properties
    assert [d.tensor for d in seen] == ["final_state dtype"]


def test_what_a_convention_cannot_carry_is_not_checkable():
    from strategies.cases import DeltaRuleCase, MixerCase
    case = DeltaRuleCase(batch=1, seq_len=5, k_heads=1, group=2, dk=8, dv=8, chunk=32,
                         dtype="float32", state_dtype="float32", seed=0, beta_regime="one")
    logit = adapt(_doc_ids_kernel, beta="logit", chunk_size=None)
    assert "logit" in unmet(logit, case_needs(case))
    assert "no chunk_size" in unmet(logit, ("chunk_argument",))
    decl = adapt(_doc_ids_kernel, qk_norm=1e-6)
    normed = dataclasses.replace(case, beta_regime="ordinary")
    assert "normalises q and k itself" in unmet(decl, case_needs(normed))
    mixer = mixer_from_core(decl)
    mcase = MixerCase(batch=1, seq_len=5, k_heads=1, group=1, dk=8, dv=8, chunk=64,
                      conv_width=4, dtype="float32", param_dtype="float32",
                      a_log_shape=(1,), dt_bias_shape=(1,), seed=0)
    assert unmet(mixer, case_needs(mcase)) is None
    assert "no QK norm" in unmet(mixer, case_needs(dataclasses.replace(mcase,
                                                                         use_qk_norm=False)))
    assert "eps=0.001" in unmet(mixer, case_needs(dataclasses.replace(mcase, eps=1e-3)))


def test_gva_through_the_adapters_repeat_is_not_checkable_against_a_repeat():
    """A kernel without GVA (heads="equal": the adapter repeats q and k) runs
    the GVA cases of every property through that repeat, but the GVA
    equivalence property compares the adapter's repeat with itself: not
    checkable, with the reason; a kernel with GVA of its own checks it."""
    from ..properties import load_all
    gva_property = next(p for p in load_all().values() if "kernel_gva" in p.needs)
    equal = adapt(_doc_ids_kernel, heads="equal")
    assert "the adapter repeats q and k" in unmet(equal, gva_property.needs)
    assert equal.supports.gva                      # its GVA cases still run
    assert unmet(adapt(_doc_ids_kernel), gva_property.needs) is None


@pytest.mark.parametrize("bad", [dict(layout="BHTD"), dict(decay="log2"),
                                 dict(chunk_size=64),
                                 dict(varlen="cu_seqlens", initial_state=False)])
def test_an_unknown_convention_is_a_named_error(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        Conventions(**bad)


DEVIATING = "verification.fixture_kernels.wrong_targets.gradients_in_q_dtype"


def _gdn_verify(tmp_path, *args):
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GDN_", "PYTEST_"))}
    env.update(GDN_EXAMPLES="2", GDN_COUNTEREXAMPLES=str(tmp_path / "counterexamples"))
    env.pop("CI", None)
    return subprocess.run(
        [sys.executable, "-c", "import sys; from verification.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", "--target", DEVIATING,
         "--jobs", "1", "--properties", "conventions_match_contract", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_deviation_fails_unless_listed_as_a_known_failure(tmp_path):
    """Gradients returned in q's dtype: one failing row (dinitial_state
    dtype) in conventions_match_contract; listed in the known-failures
    file, the property is an expected failure and the run passes."""
    failing = _gdn_verify(tmp_path)
    assert failing.returncode == 1, failing.stdout[-3000:]
    assert "[dinitial_state dtype" in failing.stdout          # its failure class's line
    report = tmp_path / "counterexamples" / "conventions_match_contract.failure.txt"
    assert "convention deviation" in report.read_text()      # its error table
    known = tmp_path / "known.txt"
    known.write_text("conventions_match_contract | dinitial_state dtype | backward in q's dtype\n")
    listed = _gdn_verify(tmp_path, f"--known-failures={known}")
    assert listed.returncode == 0, listed.stdout[-3000:]
    assert "xfail: 1 (conventions_match_contract)" in listed.stdout


def _pallas_copy(x):
    """x through a Pallas TPU-style copy kernel that takes no interpret=."""
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _pallas_kernel(q, k, v, g, beta, *, scale, initial_state=None, chunk_size=64):
    o, s = _oracle(q, k, v, g, beta, initial_state, scale=scale)
    return _pallas_copy(o), s


def test_pallas_interpret_runs_a_kernel_that_takes_no_interpret_argument():
    args = _inputs()
    run = lambda decl: jax.jit(lambda *a: decl.gated_delta_rule(   # noqa: E731
        *a[:5], initial_state=a[5]))(*args)
    if jax.default_backend() == "cpu":
        with pytest.raises(Exception, match="(?i)interpret"):
            run(adapt(_pallas_kernel))
    o, s = run(adapt(_pallas_kernel, pallas_interpret=True))
    want_o, want_s = _oracle(*args)
    np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(s, want_s, rtol=2e-5, atol=2e-5)
