"""Programs kept across runs, keyed by the whole program they compute.

A warm rerun of the suite traces every program again (that runs the
target's Python, so nothing of it is skipped), but lowering a traced program
to StableHLO costs more than the trace: a Pallas kernel in interpret mode is
discharged and re-traced into an XLA loop at every lowering (about 1 s for
the mixer's VJP on this 2-core machine, 82 s of the dev profile's 200
single-process seconds). The persistent compilation cache cannot skip it:
its key is the lowered module. This store keys a compiled executable by its
traced program instead, and loads it in milliseconds.

The key is a SHA-256 over everything lowering reads:
  - the program's jaxpr, walked whole: every equation's primitive, operands
    (numbered variables, literal values with their dtypes), results, effects,
    context (compute type, mesh, XLA metadata) and every parameter, nested
    jaxprs walked the same way, constants by their bytes, dataclasses and
    named tuples field by field (a Pallas call's grid mapping, block
    mappings, index-map jaxprs, compiler parameters);
  - the jit's own parameters (shardings, donation, compiler options), the
    argument and result tree structures;
  - the jax and jaxlib versions, the backend (platform, device kinds and
    count), XLA_FLAGS and every jax configuration value that lowering or
    compiling may read.
A parameter of a type the walk does not know (a Python callable, say a host
callback, or an object whose printed form is its address) makes the program
not storable: it is lowered and compiled as usual, and nothing is written.
The only callables passed over are the custom-derivative rules of
custom_jvp_call / custom_vjp_call, which lowering never reads (it lowers the
call's jaxpr). So an edit to a kernel is a new program, and a new key.

Where: <the persistent compilation cache's directory>/gdn-programs, on and
off with that cache (--gdn-no-compile-cache), read-only where the cache is
read-only (the mutation runner's processes: a mutant meets only programs
whose jaxpr is exactly the unmutated one's, and the mutation run killing
every mutant is this key's standing test). GDN_NO_PROGRAM_STORE=1 turns the
store alone off.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import pickle
import tempfile
import threading
import zlib
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.scipy.linalg
import numpy as np
from jax.experimental import serialize_executable
from jax.extend import core as jcore

OPT_OUT_ENV = "GDN_NO_PROGRAM_STORE"
SUBDIR = "gdn-programs"
FORMAT = b"gdn-program-store/4"
READ_ONLY_MIN_COMPILE_SECS = 1e8      # compile_cache's read-only setting

# Configuration values that say where and whether things are logged or
# cached, never what a program computes.
_VOLATILE_CONFIG = frozenset({
    "jax_compilation_cache_dir", "jax_enable_compilation_cache",
    "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes",
    "jax_compilation_cache_max_size", "jax_log_compiles", "jax_explain_cache_misses",
    "jax_logging_level", "jax_debug_log_modules", "jax_pprint_use_color",
    "jax_raise_persistent_cache_errors", "jax_traceback_filtering",
    "jax_tracer_error_num_traceback_frames"})

# What an abstract value is written out with, beside its printed form.
_AVAL_ATTRS = ("shape", "dtype", "weak_type", "sharding", "memory_space", "vma", "inner_aval")

# Parameters of these primitives that are Python callables lowering never
# reads: the custom-derivative rules (lowering lowers call_jaxpr).
_RULES_NOT_LOWERED = {"custom_jvp_call": frozenset({"jvp_jaxpr_fun", "jvp_jaxpr_thunk"}),
                      "custom_vjp_call": frozenset({"fwd_jaxpr_thunk", "bwd", "out_trees"})}


class NotStorable(Exception):
    """The program holds something the key cannot vouch for."""


# -------------------------------------------------------------- the key
class _Walk:
    """Writes a program out as a list of parts (hashed at the end, NUL-
    separated: no part holds a NUL), variables numbered in order of first
    sight."""

    def __init__(self):
        self.parts = [FORMAT.decode()]
        self.var_ids: Dict[int, int] = {}
        self.aval_texts: Dict[int, str] = {}
        self.keep = []              # what is numbered or memoized by id stays alive

    def tag(self, s: str) -> None:
        self.parts.append(s)

    def digest(self) -> str:
        text = "\x00".join(self.parts)
        if text.count("\x00") != len(self.parts) - 1:
            raise NotStorable("a part of the program's text holds a NUL")
        return hashlib.sha256(text.encode()).hexdigest()

    def var(self, v) -> None:
        if isinstance(v, jcore.DropVar):
            self.tag("_")
        else:
            n = self.var_ids.get(id(v))
            if n is None:
                n = self.var_ids[id(v)] = len(self.var_ids)
                self.keep.append(v)
            self.tag(f"v{n}")
        self.aval(v.aval)

    def aval(self, a) -> None:
        text = self.aval_texts.get(id(a))
        if text is None:
            text = "|".join([type(a).__qualname__, _checked_repr(a)] + [
                f"{attr}={_checked_repr(getattr(a, attr))}" for attr in _AVAL_ATTRS
                if hasattr(a, attr)])
            self.aval_texts[id(a)] = text
            self.keep.append(a)
        self.tag(text)

    def effects(self, effects) -> None:
        """A set of effects, in an order of their own: a reference effect
        names its variable by number (those of the enclosing jaxpr's binders)."""
        def canonical(eff) -> str:
            index = getattr(eff, "input", None)
            if isinstance(index, jcore.Var):
                n = self.var_ids.get(id(index))
                where = f"v{n}" if n is not None else f"unnumbered:{index.aval.str_short()}"
                return f"{type(eff).__qualname__}({where})"
            return _checked_repr(eff)
        self.tag(repr(sorted(canonical(eff) for eff in effects)))

    def atom(self, x) -> None:
        if _is_literal(x):
            self.tag("lit")
            self.value(x.val)
            self.aval(x.aval)
        else:
            self.var(x)

    def jaxpr(self, j) -> None:
        self.tag("jaxpr")
        for group in (j.constvars, j.invars):
            self.tag(str(len(group)))
            for v in group:
                self.var(v)
        self.tag(f"eqns{len(j.eqns)}")
        for e in j.eqns:
            self.eqn(e)
        self.tag(f"out{len(j.outvars)}")
        for x in j.outvars:
            self.atom(x)
        self.effects(j.effects)

    def eqn(self, e) -> None:
        name = e.primitive.name
        self.tag(f"eqn:{name}:{len(e.invars)}:{len(e.outvars)}")
        for x in e.invars:
            self.atom(x)
        for v in e.outvars:
            self.var(v)
        self.effects(e.effects)
        self.tag(_checked_repr(e.ctx))
        skip = _RULES_NOT_LOWERED.get(name, frozenset())
        for key in sorted(e.params):
            self.tag(key)
            if key in skip:
                continue
            self.value(e.params[key])

    def value(self, x: Any) -> None:
        if _is_closed_jaxpr(x):
            self.tag("closed")
            self.jaxpr(x.jaxpr)
            self.tag(str(len(x.consts)))
            for c in x.consts:
                self.value(c)
        elif _is_jaxpr(x):
            self.jaxpr(x)
        elif x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
            self.tag(f"{type(x).__name__}:{x!r}")
        elif isinstance(x, (np.ndarray, np.generic, jax.Array)):
            arr = np.asarray(x)
            data = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
            self.tag(f"array:{arr.dtype.str}:{arr.dtype.name}:{arr.shape}:{data}")
        elif isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
            self.tag(f"dtype:{np.dtype(x).str}:{np.dtype(x).name}")
        elif isinstance(x, enum.Enum):
            self.tag(f"enum:{type(x).__module__}.{type(x).__qualname__}.{x.name}")
        elif isinstance(x, tuple) and hasattr(x, "_fields"):
            self.tag(f"namedtuple:{type(x).__qualname__}")
            for name in x._fields:
                self.tag(name)
                self.value(getattr(x, name))
        elif isinstance(x, (tuple, list, frozenset, set)):
            items = sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x
            self.tag(f"{type(x).__name__}{len(items)}")
            for item in items:
                self.value(item)
        elif isinstance(x, dict) or type(x).__name__ == "FrozenDict":
            self.tag(f"map{len(x)}")
            for k in sorted(x, key=repr):
                self.value(k)
                self.value(x[k])
        elif _is_var(x) or _is_literal(x):
            self.atom(x)
        elif type(x).__name__ == "DebugInfo":
            self.tag("debug-info")           # names and source lines, not semantics
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            self.tag(f"dataclass:{type(x).__module__}.{type(x).__qualname__}")
            for f in dataclasses.fields(x):
                self.tag(f.name)
                self.value(getattr(x, f.name))
        elif _is_abstract_value(x):
            self.aval(x)
        elif isinstance(x, (jax.sharding.Mesh, jax.sharding.AbstractMesh, jax.sharding.Sharding,
                            jax.sharding.PartitionSpec)):
            self.tag(f"{type(x).__qualname__}:{_checked_repr(x)}")
            if _devices_of(x) > 1:
                self.tag(f"devices:{_device_ids(x)}")
        elif isinstance(x, jax.tree_util.PyTreeDef):
            self.tag(_checked_repr(x))
        elif callable(x):
            raise NotStorable(f"a callable parameter ({type(x).__qualname__})")
        else:
            self.tag(f"{type(x).__module__}.{type(x).__qualname__}:{_checked_repr(x)}")


def _devices_of(x) -> int:
    """Devices a mesh or sharding spans (1 for a PartitionSpec; 2, that is
    several, where it cannot say)."""
    try:
        if isinstance(x, jax.sharding.Sharding):
            mesh = getattr(x, "mesh", None)
            return _devices_of(mesh) if mesh is not None else len(x.device_set)
        if isinstance(x, jax.sharding.PartitionSpec):
            return 1
        return int(x.size)
    except Exception:
        return 2


def _device_ids(x) -> tuple:
    """The device ids of a mesh or sharding over several devices, in its
    order (its printed form names axis sizes, not which device is where);
    NotStorable where it cannot say."""
    try:
        mesh = (x if isinstance(x, (jax.sharding.Mesh, jax.sharding.AbstractMesh))
                else getattr(x, "mesh", None))
        if isinstance(mesh, jax.sharding.AbstractMesh):
            return ("abstract",)
        if isinstance(mesh, jax.sharding.Mesh):
            return tuple(np.asarray(mesh.device_ids).reshape(-1).tolist()) + mesh.device_ids.shape
        return tuple(d.id for d in x._device_assignment)
    except Exception as err:
        raise NotStorable(f"a sharding whose devices cannot be read ({type(x).__qualname__})") \
            from err


def _checked_repr(x) -> str:
    r = repr(x)
    if " at 0x" in r or "object at" in r or "(id=" in r:
        raise NotStorable(f"an object known only by its address ({r[:80]})")
    return r


def _is_jaxpr(x) -> bool:
    return isinstance(x, jcore.Jaxpr)


def _is_closed_jaxpr(x) -> bool:
    return isinstance(x, jcore.ClosedJaxpr)


def _is_var(x) -> bool:
    return isinstance(x, jcore.Var)


def _is_literal(x) -> bool:
    return isinstance(x, jcore.Literal)


def _is_abstract_value(x) -> bool:
    return isinstance(x, jax.core.AbstractValue)


_CONFIG_NAMES = tuple(sorted(n for n in jax.config.values if n not in _VOLATILE_CONFIG))


def _environment(walk: _Walk) -> None:
    """What lowering and compiling read besides the program."""
    for dist in ("jax", "jaxlib"):
        try:
            walk.tag(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            walk.tag(f"{dist}=?")
    walk.tag(f"jax={jax.__version__}")
    devices = jax.devices()
    walk.tag(f"backend={jax.default_backend()}:{len(devices)}:"
             + ",".join(sorted({d.device_kind for d in devices})))
    walk.tag("XLA_FLAGS=" + os.environ.get("XLA_FLAGS", ""))
    for name in _CONFIG_NAMES:
        walk.tag(name)
        walk.tag(repr(getattr(jax.config, name, None)))


def program_key(traced) -> str:
    """The key of a traced program (jax.jit(f).trace(*args)); NotStorable
    when it holds something the key cannot vouch for."""
    params = getattr(traced, "_params", None)
    if params is None or not hasattr(traced, "_consts"):
        raise NotStorable("this jax's traced programs do not expose their parameters")
    walk = _Walk()
    _environment(walk)
    walk.tag(_checked_repr(traced.in_tree))
    walk.tag(_checked_repr(traced.out_tree))
    walk.tag("consts")
    walk.value(list(traced._consts))
    for name in sorted(params):
        walk.tag(name)
        walk.value(params[name])
    return walk.digest()


# -------------------------------------------------------------- the store
def directory(subdir: str = SUBDIR) -> Optional[Tuple[str, bool]]:
    """(store directory, writable) for this process now, or None when the
    store is off (the persistent compilation cache off, or opted out).
    subdir: the store's folder in the cache (the claim plans keep theirs,
    verification/engine/claims.py, under the same rules)."""
    if os.environ.get(OPT_OUT_ENV, "") not in ("", "0"):
        return None
    if not jax.config.jax_enable_compilation_cache:
        return None
    cache_dir = jax.config.jax_compilation_cache_dir
    if not cache_dir:
        return None
    writable = jax.config.jax_persistent_cache_min_compile_time_secs < READ_ONLY_MIN_COMPILE_SECS
    return os.path.join(cache_dir, subdir), writable


def _ready_for_custom_calls() -> None:
    """What jax sets up while lowering, which a loaded executable skips:
    LAPACK's functions, behind the CPU custom calls of linear algebra (a
    triangular solve: lapack_strsm_ffi). jaxlib 0.10.2 loads them at the
    first lowering of such an op (lapack.prepare_lapack_call); an executable
    loaded in a process that lowered none calls an unset function and
    crashes (a segmentation fault, found on a layer kernel's stored VJP).
    So before the first load, one triangular solve is lowered (public API,
    not compiled). Once per process."""
    if not _ready["done"]:
        a = jax.ShapeDtypeStruct((1, 1), np.float32)
        jax.jit(functools.partial(jax.scipy.linalg.solve_triangular, lower=True)).lower(a, a)
        _ready["done"] = True


_ready = {"done": False}


def _load(path: str):
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree, device_ids = pickle.loads(zlib.decompress(f.read()))
        _ready_for_custom_calls()
        by_id = {d.id: d for d in jax.devices()}
        return serialize_executable.deserialize_and_load(
            payload, in_tree, out_tree, execution_devices=[by_id[i] for i in device_ids])
    except FileNotFoundError:
        return None
    except Exception:              # unreadable or from another build: compile anew
        return None


def _save(path: str, compiled) -> bool:
    try:
        blob = zlib.compress(pickle.dumps(serialize_executable.serialize(compiled)
                                          + (_device_ids_of(compiled),)), 1)
    except Exception:              # e.g. a tree node class pickle cannot name
        return False
    write_whole(path, blob)
    return True


def _device_ids_of(compiled) -> Tuple[int, ...]:
    """The ids of the devices the executable runs on, in its device
    assignment's order: loaded, it is put on exactly those (jax's loader
    would put it on every device of the process: in the mesh worker's
    8-device process a one-device program then takes no host arrays,
    jaxlib 0.10.2: "Expected args to execute_sharded_on_local_devices to
    have 8 shards")."""
    return tuple(d.id for d in compiled._executable._unloaded_executable.device_list)


def write_whole(path: str, blob: bytes) -> None:
    """Write blob to path by a rename: a concurrent reader finds the whole
    file under its key or none (the claim plans' store writes the same way)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)


# -------------------------------------------------------------- calls
_programs: Dict[tuple, "_Entry"] = {}
_counts = {"loaded": 0, "stored": 0, "not_storable": 0, "reloaded": 0}
_lock = threading.Lock()
_cache_reads = {"n": 0}


def _on_event(event: str, **_):
    if event == "/jax/compilation_cache/cache_hits":
        with _lock:
            _cache_reads["n"] += 1


jax.monitoring.register_event_listener(_on_event)


@dataclasses.dataclass
class _Entry:
    """A program's executable; `unproven` while a store-loaded one has not
    run yet (a load that cannot run is replaced by a fresh compile)."""
    compiled: Callable
    unproven: bool
    path: Optional[str] = None


def counts() -> Dict[str, int]:
    """Programs this process loaded from the store, stored, could not store,
    and loaded but had to compile anew (an entry that would not run)."""
    return dict(_counts)


def clear() -> None:
    """Drop this process's loaded and compiled programs (their memory maps)."""
    _programs.clear()


def _canonical(args) -> Tuple[list, Any]:
    """(leaves, tree) of args, each leaf a numpy array of its canonical
    dtype (float64 becomes float32 unless x64 is on), as jit converts them."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return [np.asarray(x, jax.dtypes.canonicalize_dtype(np.result_type(x))) for x in leaves], tree


def _signature(leaves, tree) -> tuple:
    """What this process's executable for a jitted function is kept under:
    the arguments' tree, shapes and canonical dtypes (leaves from
    _canonical), and the context a trace reads (every jax configuration
    value, x64 included, and the mesh in scope), as jit's own cache would."""
    return (tree, tuple((x.shape, x.dtype) for x in leaves),
            tuple(repr(getattr(jax.config, name, None)) for name in _CONFIG_NAMES),
            repr(jax.sharding.get_abstract_mesh()))


def call(jitted, *args):
    """jitted(*args), its executable kept across runs in the store when
    the store is on (else exactly jitted(*args)). Arguments are numpy
    arrays (or None) in pytrees, converted to their canonical dtypes."""
    where = directory()
    if where is None:
        return jitted(*args)
    sig, leaves, tree = _kept(jitted, args, where)
    entry = _programs[sig]
    canon = jax.tree_util.tree_unflatten(tree, leaves)
    if not entry.unproven:
        return entry.compiled(*canon)
    try:
        out = jax.block_until_ready(entry.compiled(*canon))
    except Exception:              # a stored executable that does not run: compile anew
        with _lock:
            _counts["reloaded"] += 1
        _discard(entry.path)
        entry = _programs[sig] = _Entry(jitted.trace(*args).lower().compile(), False)
        return entry.compiled(*canon)
    entry.unproven = False
    return out


def compiled_text(jitted, *args) -> str:
    """The compiled HLO text of jitted on args (compiled, not run): from
    the executable the store keeps for the program where it keeps one, so a
    warm run reads a program's text without lowering or compiling it again
    (a loaded executable's text is the compiled one's, up to the stack
    frame numbers of its metadata). Arguments as for call."""
    where = directory()
    if where is None:
        return jitted.trace(*args).lower().compile().as_text()
    sig, _, _ = _kept(jitted, args, where)
    return _programs[sig].compiled.as_text()


def _kept(jitted, args, where: Tuple[str, bool]):
    """(key of this process's entry, canonical leaves, tree) of jitted on
    args, the entry built (loaded from the store, or compiled and stored)
    when this process has none yet."""
    leaves, tree = _canonical(args)
    sig = (jitted, _signature(leaves, tree))
    if sig not in _programs:
        _programs[sig] = _build(jitted, args, *where)
    return sig, leaves, tree


def _discard(path: Optional[str]) -> None:
    try:
        if path:
            os.remove(path)
    except OSError:
        pass


def _build(jitted, args, store_dir: str, writable: bool) -> _Entry:
    """The executable of jitted on args: loaded from the store, or lowered
    and compiled (through the persistent cache) and stored. An executable
    the persistent cache served is not stored: XLA:CPU serializes such a
    one without its compiled functions (jaxlib 0.10.2: it loads, then fails
    to run with "Function ... not found")."""
    traced = jitted.trace(*args)
    try:
        path = os.path.join(store_dir, program_key(traced) + ".program")
    except Exception:              # NotStorable, or a walk this jax surprises: never stored
        with _lock:
            _counts["not_storable"] += 1
        return _Entry(traced.lower().compile(), False)
    compiled = _load(path)
    if compiled is not None:
        with _lock:
            _counts["loaded"] += 1
        return _Entry(compiled, True, path)
    reads = _cache_reads["n"]
    compiled = traced.lower().compile()
    if writable and _cache_reads["n"] == reads and _save(path, compiled):
        with _lock:
            _counts["stored"] += 1
    return _Entry(compiled, False)
