"""The implementations are one table (gdn_kernels/backends.py BACKENDS):
validation, the API and the mutants read it, so a new backend is one table
entry and one module. Shown on a copy of the package with a toy backend
(the token-by-token path at every length) added that way."""

import importlib
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gdn_kernels
from gdn_kernels.backends import BACKENDS, CHUNKED
from gdn_kernels.validation import IMPLS

from ..mutants import MUTANTS

TOY_MODULE = '''"""A toy backend: the token-by-token path at every length."""
from .recurrent_impl import backward, forward  # noqa: F401
'''
XLA_ENTRY = '    "xla": Backend(".xla_impl"),\n'


def test_validation_and_the_mutants_read_the_table():
    assert IMPLS == tuple(BACKENDS)
    assert set(CHUNKED) == {n for n, b in BACKENDS.items() if b.module}
    assert all(set(m.impls) <= set(CHUNKED) for m in MUTANTS.values())


def test_a_toy_backend_is_one_table_entry_and_one_module(tmp_path, monkeypatch):
    package = tmp_path / "gdn_toy_backend"
    shutil.copytree(os.path.dirname(gdn_kernels.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (package / "toy_impl.py").write_text(TOY_MODULE)
    table = (package / "backends.py").read_text()
    assert table.count(XLA_ENTRY) == 1
    (package / "backends.py").write_text(
        table.replace(XLA_ENTRY, XLA_ENTRY + '    "toy": Backend(".toy_impl"),\n'))
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("gdn_toy_backend")

    rng = np.random.default_rng(0)
    b, t, hk, hv, d = 1, 40, 1, 2, 16
    q, k = (jnp.asarray(rng.normal(size=(b, t, hk, d)) / 4, jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(b, t, hv, d)), jnp.float32)
    g = jnp.asarray(-np.abs(rng.normal(size=(b, t, hv))) / 4, jnp.float32)
    beta = jnp.asarray(rng.uniform(0.1, 0.9, size=(b, t, hv)), jnp.float32)

    def loss(fn, impl):
        return lambda *a: jnp.sum(fn(*a, impl=impl, chunk_size=16)[0] ** 2)

    args = (q, k, v, g, beta)
    want = jax.grad(loss(gdn_kernels.gated_delta_rule, "xla"), argnums=range(5))(*args)
    got = jax.grad(loss(toy.gated_delta_rule, "toy"), argnums=range(5))(*args)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=2e-5, atol=2e-6)
    with pytest.raises(ValueError, match="'toy'"):
        toy.gated_delta_rule(*args, impl="cuda")
