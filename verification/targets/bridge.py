"""The bridge: a kernel of another framework made a JAX function the suite
calls (from_torch in torch_bridge.py, from_mlx in mlx_bridge.py).

The JAX side is here, the same for every framework: a bridged function
takes and returns JAX arrays with the kernel's own signature and
conventions (so `adapt` puts the contract's on top). Its forward runs the
kernel through `jax.pure_callback`; its VJP runs the kernel's own VJP
(the framework's autodiff, with the suite's cotangents) through a second
callback, recomputing the forward there: the callbacks keep nothing
between calls.

Arguments: each positional or keyword argument that is an array (a JAX
array, a tracer or a numpy array) is handed to the kernel as the
framework's array of the same dtype; anything else (a float scale, an int
chunk size, a bool, None) is passed as it is and is part of the program.
Outputs: arrays, None, or tuples / lists of them; an integer output has no
cotangent.

64-bit values: the callback converts its operands and results to the
dtypes of the thread it runs on, an XLA thread where a `jax.enable_x64`
context of the caller does not hold, so a float64 operand would reach the
kernel as float32. 64-bit arrays therefore cross as their bits, uint32
pairs (a trailing axis of 2), viewed back on each side.

Compile counts of a bridged target are the JAX wrapper's, not the kernel's:
a bridged function carries a Bridge under declaration.BRIDGE_ATTR (the
adapters pass it on to their wrappers), and the properties that count
compiles are not checkable on it (declaration.NEEDS["xla_programs"]).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .declaration import BRIDGE_ATTR


@dataclasses.dataclass(frozen=True)
class Bridge:
    """Where a bridged kernel runs: its framework, device and threads."""
    framework: str
    device: str
    threads: Optional[int] = None

    def describe(self) -> str:
        threads = "" if self.threads is None else f", {self.threads} intra-op thread(s)"
        return (f"{self.framework} kernel through from_{self.framework} (on {self.device}"
                f"{threads}): compile counts not checkable")


# ------------------------------------------------------------ the call
@dataclasses.dataclass(frozen=True)
class ArraySlot:
    """Where the call's index-th array goes among the kernel's arguments."""
    index: int


@dataclasses.dataclass(frozen=True)
class Call:
    """One call's static part: an ArraySlot for each array argument, the
    non-array arguments as they are."""
    positional: Tuple[Any, ...]
    keywords: Tuple[Tuple[str, Any], ...]

    def arguments(self, arrays):
        """The kernel's (args, kwargs), the slots filled from arrays."""
        fill = lambda v: arrays[v.index] if isinstance(v, ArraySlot) else v
        return tuple(map(fill, self.positional)), {k: fill(v) for k, v in self.keywords}


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def split_call(args, kwargs) -> Tuple[Call, Tuple[Any, ...]]:
    """(the call's static part, its arrays in order)."""
    arrays: List[Any] = []

    def slot(value):
        if _is_array(value):
            arrays.append(value)
            return ArraySlot(len(arrays) - 1)
        return value

    positional = tuple(slot(a) for a in args)
    keywords = tuple((k, slot(v)) for k, v in kwargs.items())
    return Call(positional, keywords), tuple(arrays)


# ------------------------------------------------------------ outputs
def flatten(out, is_array: Callable[[Any], bool], framework: str) -> Tuple[List[Any], Any]:
    """(array leaves, structure) of a kernel's output: arrays, None, tuples
    and lists of them (TypeError naming anything else)."""
    if out is None:
        return [], None
    if is_array(out):
        return [out], "array"
    if isinstance(out, (tuple, list)):
        leaves, parts = [], []
        for item in out:
            sub, part = flatten(item, is_array, framework)
            leaves += sub
            parts.append(part)
        return leaves, (type(out), tuple(parts))
    raise TypeError(f"from_{framework}: the kernel returned a {type(out).__name__}; expected "
                    f"arrays, None, or tuples / lists of them")


def unflatten(structure, leaves) -> Any:
    """The output of flatten rebuilt from an iterator of leaves."""
    if structure is None:
        return None
    if structure == "array":
        return next(leaves)
    kind, parts = structure
    return kind(unflatten(p, leaves) for p in parts)


# ------------------------------------------------------------ 64-bit values
def _is_wide(dtype) -> bool:
    return np.dtype(dtype).itemsize == 8


def _wire_struct(struct: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    if _is_wide(struct.dtype):
        return jax.ShapeDtypeStruct(tuple(struct.shape) + (2,), jnp.uint32)
    return struct


def _onto_wire(x):
    """A JAX array as it crosses to the host."""
    return jax.lax.bitcast_convert_type(x, jnp.uint32) if _is_wide(x.dtype) else x


def _off_wire(y, dtype):
    """What the host sent back, as a JAX array of dtype."""
    return jax.lax.bitcast_convert_type(y, dtype) if _is_wide(dtype) else y


def from_wire(array, dtype) -> np.ndarray:
    """A host operand in its own dtype."""
    array = np.asarray(array)
    if _is_wide(dtype):
        return np.ascontiguousarray(array).view(np.dtype(dtype))[..., 0]
    return array


def to_wire(array: np.ndarray) -> np.ndarray:
    """A host result as it crosses back."""
    if _is_wide(array.dtype):
        array = np.ascontiguousarray(array)
        return array.view(np.uint32).reshape(array.shape + (2,))
    return array


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


# ------------------------------------------------------------ the kernel
class HostKernel:
    """A kernel of another framework run on numpy arrays (the host side of
    the callbacks): each framework's subclass says how."""

    def output_structure(self, call: Call, specs) -> Tuple[Any, Tuple[jax.ShapeDtypeStruct, ...]]:
        """(output structure, ShapeDtypeStruct per leaf) of the kernel on
        inputs of these (shape, numpy dtype) specs."""
        raise NotImplementedError

    def forward(self, call: Call, in_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        """The output leaves (on the wire) of the kernel on these inputs."""
        raise NotImplementedError

    def vjp(self, call: Call, in_dtypes, ct_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        """The gradients (on the wire) of the kernel's floating inputs, in
        order, for the cotangents of its floating outputs (wires: the
        inputs, then those cotangents), by the framework's autodiff."""
        raise NotImplementedError


def bridged_function(fn: Callable, kernel: HostKernel, bridge: Bridge) -> Callable:
    """fn's JAX twin: called as fn is, run by kernel, marked with bridge."""
    structures = functools.lru_cache(maxsize=256)(kernel.output_structure)

    @functools.wraps(fn)
    def bridged(*args, **kwargs):
        call, arrays = split_call(args, kwargs)
        specs = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in arrays)
        try:
            structure, out_structs = structures(call, specs)
        except TypeError as err:          # an unhashable non-array argument
            if "unhashable" not in str(err):
                raise
            structure, out_structs = kernel.output_structure(call, specs)
        return unflatten(structure, iter(_bridged_call(kernel, call, out_structs, arrays)))

    setattr(bridged, BRIDGE_ATTR, bridge)
    return bridged


def _bridged_call(kernel: HostKernel, call: Call, out_structs, arrays):
    """The output leaves of the kernel on arrays, differentiable by its own
    framework's autodiff."""
    in_dtypes = tuple(np.dtype(a.dtype) for a in arrays)
    floats_in = tuple(is_float(d) for d in in_dtypes)
    float_outs = tuple(i for i, s in enumerate(out_structs) if is_float(s.dtype))
    ct_dtypes = tuple(np.dtype(out_structs[i].dtype) for i in float_outs)

    def forward(*xs):
        wires = jax.pure_callback(functools.partial(kernel.forward, call, in_dtypes),
                                  tuple(map(_wire_struct, out_structs)), *map(_onto_wire, xs),
                                  vmap_method="sequential")
        return tuple(_off_wire(w, s.dtype) for w, s in zip(wires, out_structs))

    @jax.custom_vjp
    def run(*xs):
        return forward(*xs)

    def run_fwd(*xs):
        return forward(*xs), xs

    def run_bwd(xs, cts):
        grad_structs = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype)
                             for x, floating in zip(xs, floats_in) if floating)
        wires = jax.pure_callback(
            functools.partial(kernel.vjp, call, in_dtypes, ct_dtypes),
            tuple(map(_wire_struct, grad_structs)), *map(_onto_wire, xs),
            *(_onto_wire(cts[i]) for i in float_outs), vmap_method="sequential")
        grads = iter(_off_wire(w, s.dtype) for w, s in zip(wires, grad_structs))
        return tuple(next(grads) if floating else None for floating in floats_in)

    run.defvjp(run_fwd, run_bwd)
    return run(*arrays)
