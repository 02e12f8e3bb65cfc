"""The program store (verification/engine/program_store.py): its key is the
whole traced program, so a program that computes anything else (a constant,
a literal, a dtype, a Pallas block's index map, a derivative rule) has
another key; the same program traced again has the same key; what the key
cannot vouch for (a host callback) is never stored; a stored program runs
bitwise as the jitted one; read-only and opted-out stores write nothing."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from ..engine import program_store


def key_of(fn, *args):
    return program_store.program_key(jax.jit(fn).trace(*args))


X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


def _affine():
    def f(x):
        return jnp.tanh(x) @ x.T + 1.5
    return f


def test_the_same_program_traced_again_has_the_same_key():
    assert key_of(_affine(), X) == key_of(_affine(), X)


@pytest.mark.parametrize("other", [
    lambda x: jnp.tanh(x) @ x.T + 2.5,                                    # a literal
    lambda x: jnp.tanh(x) @ x.T + jnp.asarray(np.full((3, 3), 1.5, np.float32)) * 1.0001,
    lambda x: jnp.sin(x) @ x.T + 1.5,                                     # a primitive
    lambda x: (jnp.tanh(x) @ x.T + 1.5).astype(jnp.bfloat16),             # a dtype
])
def test_a_program_computing_anything_else_has_another_key(other):
    assert key_of(lambda x: jnp.tanh(x) @ x.T + 1.5, X) != key_of(other, X)
    assert key_of(lambda x: jnp.tanh(x) @ x.T + 1.5, X) == key_of(lambda x: jnp.tanh(x) @ x.T + 1.5, X)


def test_a_closed_over_constant_is_keyed_by_its_value():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[2, 3] += 1.0
    assert key_of(lambda x: x * a, X) == key_of(lambda x: x * a.copy(), X)
    assert key_of(lambda x: x * a, X) != key_of(lambda x: x * b, X)


def _copy_kernel(index_map):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0
    spec = pl.BlockSpec((1, 4), index_map)
    return pl.pallas_call(kernel, grid=(3,), in_specs=[spec],
                          out_specs=pl.BlockSpec((1, 4), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((3, 4), jnp.float32), interpret=True)


def test_a_pallas_block_index_map_is_part_of_the_key():
    same = key_of(_copy_kernel(lambda i: (i, 0)), X)
    assert same == key_of(_copy_kernel(lambda i: (i, 0)), X)
    assert same != key_of(_copy_kernel(lambda i: (2 - i, 0)), X)


def _with_rule(scale):
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return jnp.sin(x), scale * jnp.cos(x) * t
    return f


def test_a_derivative_rule_is_part_of_a_gradient_programs_key():
    grad_of = lambda f: (lambda x: jax.grad(lambda y: f(y).sum())(x))    # noqa: E731
    assert key_of(grad_of(_with_rule(1.0)), X) == key_of(grad_of(_with_rule(1.0)), X)
    assert key_of(grad_of(_with_rule(1.0)), X) != key_of(grad_of(_with_rule(2.0)), X)


def test_a_host_callback_is_never_stored():
    def f(x):
        return jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    with pytest.raises(program_store.NotStorable):
        key_of(f, X)


def _store_at(monkeypatch, tmp_path, writable=True):
    """The store in tmp_path (the process's jax configuration untouched)."""
    monkeypatch.setattr(program_store, "directory",
                        lambda: (str(tmp_path / program_store.SUBDIR), writable))
    program_store.clear()


@functools.lru_cache(maxsize=None)
def _program():
    """A program no earlier run compiled (a constant of this session's own),
    so the persistent cache cannot serve it."""
    salt = float(int.from_bytes(os.urandom(3), "little"))         # a literal of the program
    return jax.jit(lambda x, y: (jnp.tanh(x) @ y.T, x.sum() + salt))


def test_a_stored_program_runs_bitwise_as_the_jitted_one(tmp_path, monkeypatch):
    _store_at(monkeypatch, tmp_path)
    y = X[::-1].copy()
    before = program_store.counts()
    first = program_store.call(_program(), X, y)
    assert program_store.counts()["stored"] == before["stored"] + 1
    program_store.clear()
    again = program_store.call(_program(), X, y.astype(np.float64))   # canonical dtypes
    assert program_store.counts()["loaded"] == before["loaded"] + 1
    expected = _program()(X, y)
    for got in (first, again):
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            assert np.array_equal(np.asarray(g), np.asarray(e))
    assert len(os.listdir(tmp_path / program_store.SUBDIR)) == 1
    program_store.clear()


def test_a_read_only_store_writes_nothing(tmp_path, monkeypatch):
    _store_at(monkeypatch, tmp_path, writable=False)
    program_store.call(_program(), X, X)
    assert not (tmp_path / program_store.SUBDIR).exists()
    program_store.clear()


def test_the_store_is_off_where_the_compile_cache_is_off_or_opted_out(monkeypatch):
    monkeypatch.setenv(program_store.OPT_OUT_ENV, "1")
    assert program_store.directory() is None
    monkeypatch.delenv(program_store.OPT_OUT_ENV)
    where = program_store.directory()
    if not jax.config.jax_enable_compilation_cache:
        assert where is None
    else:
        assert where[0] == os.path.join(jax.config.jax_compilation_cache_dir,
                                        program_store.SUBDIR)


# Three processes on one cache directory: the first compiles the program
# and stores it; the second, its store deleted, is served the program by the
# persistent cache, runs it, and stores nothing (XLA:CPU would serialize
# that one without its functions); the third finds a store entry written
# from such an executable (planted), which loads but cannot run: it is
# replaced by a fresh compile and the results are the same.
SCRIPT = r"""
import json, os, pickle, shutil, sys, zlib
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from jax.experimental import serialize_executable
from verification.engine import program_store
f = jax.jit(lambda x, y: (jnp.tanh(x) @ y.T, x.sum()))
x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
store = os.path.join(sys.argv[1], program_store.SUBDIR)
if sys.argv[2] == "second":
    shutil.rmtree(store)
if sys.argv[2] == "third":
    traced = f.trace(x, x)
    path = os.path.join(store, program_store.program_key(traced) + ".program")
    os.makedirs(store, exist_ok=True)
    served = traced.lower().compile()                   # from the persistent cache
    with open(path, "wb") as fh:
        fh.write(zlib.compress(pickle.dumps(serialize_executable.serialize(served) + ((0,),))))
out = program_store.call(f, x, x)
print(json.dumps({"counts": program_store.counts(), "out": float(np.asarray(out[0]).sum()),
                  "files": len(os.listdir(store)) if os.path.isdir(store) else 0}))
"""


def test_a_program_the_persistent_cache_served_is_never_stored(tmp_path):
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAX_") and k != program_store.OPT_OUT_ENV}
    runs = {}
    for step in ("first", "second", "third"):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), step], cwd=root,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[step] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs["first"]["counts"]["stored"] == 1 and runs["first"]["files"] == 1
    assert runs["second"]["counts"]["stored"] == 0 and runs["second"]["files"] == 0
    third = runs["third"]["counts"]
    assert third["loaded"] == 1 and third["reloaded"] == 1, third
    assert runs["first"]["out"] == runs["second"]["out"] == runs["third"]["out"]


# Two processes on one cache directory: the first stores a program calling
# LAPACK (a triangular solve: a CPU custom call), the second loads it having
# lowered nothing, and runs it. jax initializes LAPACK only while lowering
# such an op: without the store doing it before a load, the second process
# died of a segmentation fault (a layer kernel's stored VJP did).
LAPACK_SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from jax.scipy.linalg import solve_triangular
from verification.engine import program_store
f = jax.jit(lambda a, b: solve_triangular(jnp.tril(a) + 4 * jnp.eye(4), b, lower=True))
a = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
out = program_store.call(f, a, a)
print(json.dumps({"counts": program_store.counts(), "out": float(np.asarray(out).sum())}))
"""


def _two_processes(script: str, cache_dir) -> list:
    """What the script printed last (JSON), run twice, each in a fresh
    process on the same compile cache directory (the store's)."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAX_") and k != program_store.OPT_OUT_ENV}
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", script, str(cache_dir)], cwd=root,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return runs


def test_a_stored_program_calling_lapack_runs_in_a_fresh_process(tmp_path):
    runs = _two_processes(LAPACK_SCRIPT, tmp_path)
    assert runs[0]["counts"]["stored"] == 1 and runs[1]["counts"]["loaded"] == 1, runs
    assert runs[1]["counts"]["reloaded"] == 0 and runs[0]["out"] == runs[1]["out"]


# Two processes of 4 CPU devices on one cache directory (the mesh worker's
# kind of process): a program over a (2, 2) mesh and a one-device program,
# stored by the first, loaded by the second onto the devices each was
# compiled for. Loaded onto every device of the process (jax's loader
# default), the one-device program refused its host arrays (jaxlib 0.10.2:
# "Expected args to execute_sharded_on_local_devices to have 4 shards"), and
# the store kept no program of the mesh worker at all. The same program on
# the devices in another order has another key.
MESH_SCRIPT = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from verification.engine import program_store

def on(devices):
    mesh = Mesh(np.array(devices).reshape(2, 2), ("data", "model"))
    def f(x, y):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data", "model")))
        return jnp.tanh(x) @ y.T, x.sum()
    return jax.jit(f)

meshed, reversed_ = on(jax.devices()), on(jax.devices()[::-1])
one = jax.jit(lambda x, y: (jnp.tanh(x) @ y.T, x.sum()))
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
keys = [program_store.program_key(f.trace(x, x)) for f in (meshed, reversed_)]
outs = [program_store.call(f, x, x) for f in (meshed, one)]
print(json.dumps({"counts": program_store.counts(), "distinct_keys": keys[0] != keys[1],
                  "out": [float(np.asarray(o[0]).sum()) for o in outs]}))
"""


def test_programs_of_a_process_of_several_devices_load_onto_their_devices(tmp_path):
    runs = _two_processes(MESH_SCRIPT, tmp_path)
    assert runs[0]["counts"]["stored"] == 2 and runs[1]["counts"]["loaded"] == 2, runs
    assert runs[1]["counts"]["reloaded"] == 0, runs
    assert runs[0]["out"] == runs[1]["out"] and runs[0]["distinct_keys"], runs


def test_a_key_that_cannot_be_computed_only_means_not_stored(tmp_path, monkeypatch):
    """Whatever the walk meets (a jax it does not know), the program runs as
    jitted: the store never changes a result or a verdict."""
    _store_at(monkeypatch, tmp_path)

    def surprised(traced):
        raise ValueError("device_set is not implemented")
    monkeypatch.setattr(program_store, "program_key", surprised)
    before = program_store.counts()
    out = program_store.call(_program(), X, X)
    assert program_store.counts()["not_storable"] == before["not_storable"] + 1
    assert np.array_equal(np.asarray(out[0]), np.asarray(_program()(X, X)[0]))
    assert not (tmp_path / program_store.SUBDIR).exists()
    program_store.clear()


# The compiled text of a program over a (2, 2) mesh (what the sharding
# property reads its collectives from), asked for in two processes on one
# cache directory: the first compiles and stores the program, the second
# reads the text from the stored executable, compiling nothing; the text is
# the same but for the stack frame numbers in its metadata.
TEXT_SCRIPT = r"""
import json, os, re, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from verification.engine import program_store
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **_: compiles.append(event)
    if event == "/jax/core/compile/backend_compile_duration" else None)
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
def f(x):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("data", "model")))
    return jnp.tanh(x).sum()
x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
text = program_store.compiled_text(jax.jit(f), x)
instructions = [re.sub(r", metadata=\{[^}]*\}", "", line) for line in text.splitlines()
                if " = " in line]
print(json.dumps({"counts": program_store.counts(), "compiles": len(compiles),
                  "all_reduce": "all-reduce(" in text, "instructions": instructions}))
"""


def test_a_stored_programs_compiled_text_is_read_without_compiling(tmp_path):
    runs = _two_processes(TEXT_SCRIPT, tmp_path)
    assert runs[0]["counts"]["stored"] == 1 and runs[0]["compiles"] == 1, runs[0]["counts"]
    assert runs[1]["counts"]["loaded"] == 1 and runs[1]["compiles"] == 0, runs[1]["counts"]
    assert runs[0]["all_reduce"] and runs[0]["instructions"] == runs[1]["instructions"]
