"""from_torch: a PyTorch function made a JAX function the suite calls.

    from verification import adapt, from_torch

    GDN_KERNEL = adapt(from_torch(my_torch_kernel), layout="head_first", ...)

`from_torch(fn)` returns a function taking and returning JAX arrays with
fn's own signature and conventions (so `adapt` puts the contract's on top).
Its forward runs fn in torch through `jax.pure_callback`; its VJP runs fn
again under torch's autograd and asks `torch.autograd.grad` for the input
gradients with the suite's cotangents, so the gradients judged are the
kernel's own (a hand-written `torch.autograd.Function` backward is exactly
what is verified). The callback keeps no torch graph between forward and
backward: the backward recomputes the forward (a stateless program, as the
suite's programs are).

Arguments: each positional or keyword argument that is an array (a JAX
array, a tracer or a numpy array) is handed to fn as a torch tensor of the
same dtype, on the bridge's device; anything else (a float scale, an int
chunk size, a bool, None) is passed as it is and is part of the program
(a new value, a new trace). Outputs: a tensor, None, or tuples / lists of
them; an integer output has no cotangent. Dtypes are carried exactly:
float64 stays float64 (the oracle-grade cases are not rounded), bfloat16
stays bfloat16 (bit views through ml_dtypes, no float32 on the way), and
what fn returns in another dtype than its inputs comes back in that dtype
(the adapter records it as a deviation, as for a JAX kernel).

Device: "auto" runs fn on CUDA when torch sees a GPU (inputs moved there,
results back to the host), else on the CPU; or name one ("cpu", "cuda:0").

Threads: torch's intra-op pool is set to `threads` (default 1) for the
process when the bridge is made, so torch and XLA's CPU pool do not
oversubscribe the cores of a small machine (pytest-xdist already runs one
worker per core); fn runs on the XLA thread that calls the callback, one
call at a time, so no pool waits on the other. Determinism: the bridge
leaves torch's `use_deterministic_algorithms` as the process has it (the
kernel is verified as it runs); the suite's determinism property checks
that two calls give the same bits.

What a bridged kernel cannot carry is said by the properties, never
passed: XLA compile counts (one program per shape, a decode loop that
compiles once) are about the JAX wrapper, not the kernel, so they are not
checkable on a target whose ops are bridged (`bridge_of`); a bridged
kernel declares no sharded() either.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, List, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .declaration import BRIDGE_ATTR, bridge_of


@dataclasses.dataclass(frozen=True)
class Bridge:
    """Where a bridged kernel runs: its framework, device and threads."""
    framework: str
    device: str
    threads: Optional[int]

    def describe(self) -> str:
        threads = "" if self.threads is None else f", {self.threads} intra-op thread(s)"
        return (f"{self.framework} kernel through from_{self.framework} (on {self.device}"
                f"{threads}): compile counts not checkable")


def _torch():
    try:
        import torch
    except ImportError as err:
        raise ImportError("from_torch needs PyTorch: pip install 'gdn-verify[torch]' "
                          f"(or torch itself) ({err})") from None
    return torch


def _device(torch, device: str):
    if not isinstance(device, str):
        raise TypeError(f"from_torch: device must be a string ('auto', 'cpu', 'cuda', "
                        f"'cuda:N'), got {type(device).__name__}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"from_torch: device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"from_torch: device {device!r}, but torch sees no CUDA device")
    return dev


# ------------------------------------------------------------ dtypes
def _torch_dtype(torch, dtype) -> Any:
    dtype = np.dtype(dtype)
    if dtype == ml_dtypes.bfloat16:
        return torch.bfloat16
    try:
        return torch.from_numpy(np.empty((0,), dtype)).dtype
    except TypeError:
        raise TypeError(f"from_torch: no torch dtype for {dtype}") from None


def _to_torch(torch, array: np.ndarray, device):
    """A numpy array (bfloat16 through an int16 bit view) as a torch tensor
    on device; a copy where the array is read-only (JAX's buffers are)."""
    array = np.require(array, requirements=("C", "W"))
    if array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor.to(device)


def _to_numpy(torch, tensor) -> np.ndarray:
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _jax_dtype(torch, dtype):
    if dtype == torch.bfloat16:
        return jnp.bfloat16
    return torch.empty((0,), dtype=dtype).numpy().dtype


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


# ------------------------------------------------------------ outputs
def _flatten(torch, out) -> Tuple[List[Any], Any]:
    """(tensor leaves, structure) of fn's output: tensors, None, tuples and
    lists of them (TypeError naming anything else)."""
    if out is None:
        return [], None
    if isinstance(out, torch.Tensor):
        return [out], "tensor"
    if isinstance(out, (tuple, list)):
        leaves, parts = [], []
        for item in out:
            sub, part = _flatten(torch, item)
            leaves += sub
            parts.append(part)
        return leaves, (type(out), tuple(parts))
    raise TypeError(f"from_torch: the kernel returned a {type(out).__name__}; expected "
                    f"tensors, None, or tuples / lists of them")


def _unflatten(structure, leaves) -> Any:
    """The output of _flatten rebuilt from an iterator of leaves."""
    if structure is None:
        return None
    if structure == "tensor":
        return next(leaves)
    kind, parts = structure
    return kind(_unflatten(p, leaves) for p in parts)


# ------------------------------------------------------------ the call
@dataclasses.dataclass(frozen=True)
class _Call:
    """One call's static part: where each array goes among fn's arguments,
    and the non-array arguments."""
    positional: Tuple[Any, ...]     # an _ArraySlot or the value itself
    keywords: Tuple[Tuple[str, Any], ...]

    def arguments(self, arrays):
        """fn's (args, kwargs) with the slots filled from arrays."""
        fill = lambda v: arrays[v.index] if isinstance(v, _ArraySlot) else v
        return tuple(map(fill, self.positional)), {k: fill(v) for k, v in self.keywords}


@dataclasses.dataclass(frozen=True)
class _ArraySlot:
    index: int


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _split_call(args, kwargs) -> Tuple[_Call, Tuple[Any, ...]]:
    """(the call's static part, its arrays in order)."""
    arrays: List[Any] = []

    def slot(value):
        if _is_array(value):
            arrays.append(value)
            return _ArraySlot(len(arrays) - 1)
        return value

    positional = tuple(slot(a) for a in args)
    keywords = tuple((k, slot(v)) for k, v in kwargs.items())
    return _Call(positional, keywords), tuple(arrays)


class _TorchKernel:
    """fn run in torch on numpy arrays: its forward, its VJP, and its
    outputs' shapes and dtypes (from a run on torch's meta device, or on
    zeros where the kernel cannot run there)."""

    def __init__(self, torch, fn: Callable, device):
        self.torch, self.fn, self.device = torch, fn, device

    def _run(self, call: _Call, tensors):
        args, kwargs = call.arguments(tensors)
        return self.fn(*args, **kwargs)

    def output_structure(self, call: _Call, specs) -> Tuple[Any, Tuple[jax.ShapeDtypeStruct, ...]]:
        """(output structure, ShapeDtypeStruct per leaf) of fn on inputs of
        these (shape, dtype) specs."""
        torch = self.torch
        failures = []
        for device, make in (("meta", torch.empty), (self.device, torch.zeros)):
            tensors = [make(shape, dtype=_torch_dtype(torch, dtype), device=device)
                       for shape, dtype in specs]
            try:
                with torch.no_grad():
                    out = self._run(call, tensors)
            except (NotImplementedError, RuntimeError, ValueError, IndexError) as err:
                failures.append(f"on {device}: {type(err).__name__}: {err}")
                continue
            leaves, structure = _flatten(torch, out)
            return structure, tuple(jax.ShapeDtypeStruct(tuple(t.shape),
                                                         _jax_dtype(torch, t.dtype))
                                    for t in leaves)
        raise RuntimeError("from_torch: the kernel's output shapes could not be found by "
                           "running it on torch's meta device or on zeros: "
                           + "; ".join(failures))

    def forward(self, call: _Call, in_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        torch = self.torch
        tensors = [_to_torch(torch, _from_wire(w, d), self.device)
                   for w, d in zip(wires, in_dtypes)]
        with torch.no_grad():
            leaves, _ = _flatten(torch, self._run(call, tensors))
        return tuple(_to_wire(_to_numpy(torch, t)) for t in leaves)

    def vjp(self, call: _Call, in_dtypes, ct_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        """The gradients of fn's floating inputs (in order) for the
        cotangents of its floating outputs, by torch's autograd."""
        torch = self.torch
        n = len(in_dtypes)
        tensors = [_to_torch(torch, _from_wire(w, d), self.device)
                   for w, d in zip(wires[:n], in_dtypes)]
        cts = [_from_wire(w, d) for w, d in zip(wires[n:], ct_dtypes)]
        wrt = [t.requires_grad_(True) for t in tensors if t.is_floating_point()]
        with torch.enable_grad():
            leaves, _ = _flatten(torch, self._run(call, tensors))
        pairs = [(out, _to_torch(torch, ct, self.device))
                 for out, ct in zip((o for o in leaves if o.is_floating_point()), cts)
                 if out.requires_grad]
        grads = [None] * len(wrt)
        if pairs and wrt:
            grads = torch.autograd.grad([o for o, _ in pairs], wrt,
                                        grad_outputs=[c for _, c in pairs], allow_unused=True)
        return tuple(_to_wire(_to_numpy(torch, torch.zeros_like(x) if g is None else g))
                     for x, g in zip(wrt, grads))


# ------------------------------------------------------------ 64-bit values
# The callback converts its operands and results to the dtypes of the
# thread it runs on, an XLA thread where a `jax.enable_x64` context of the
# caller does not hold: a float64 operand would reach the kernel as
# float32. So 64-bit arrays cross as their bits, uint32 pairs (a trailing
# axis of 2), and are viewed back on each side.
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


def _from_wire(array, dtype) -> np.ndarray:
    """A host operand in its own dtype."""
    array = np.asarray(array)
    if _is_wide(dtype):
        return np.ascontiguousarray(array).view(np.dtype(dtype))[..., 0]
    return array


def _to_wire(array: np.ndarray) -> np.ndarray:
    """A host result as it crosses back."""
    if _is_wide(array.dtype):
        array = np.ascontiguousarray(array)
        return array.view(np.uint32).reshape(array.shape + (2,))
    return array


def from_torch(fn: Callable, *, device: str = "auto", threads: Optional[int] = 1) -> Callable:
    """fn, a PyTorch function, as a JAX function of the same signature (see
    the module docstring): forward by a host callback, VJP by torch's
    autograd. device: "auto" (CUDA when present, else CPU), "cpu", "cuda",
    "cuda:N"; threads: torch's intra-op threads for the process (None:
    leave torch's setting)."""
    torch = _torch()
    if not callable(fn):
        raise TypeError(f"from_torch: fn must be callable, got {type(fn).__name__}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"from_torch: threads must be an int >= 1 or None, got {threads!r}")
    dev = _device(torch, device)
    if threads is not None:
        torch.set_num_threads(threads)
    kernel = _TorchKernel(torch, fn, dev)
    structures = functools.lru_cache(maxsize=256)(kernel.output_structure)

    @functools.wraps(fn)
    def bridged(*args, **kwargs):
        call, arrays = _split_call(args, kwargs)
        specs = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in arrays)
        try:
            structure, out_structs = structures(call, specs)
        except TypeError as err:          # an unhashable non-array argument
            if "unhashable" not in str(err):
                raise
            structure, out_structs = kernel.output_structure(call, specs)
        result = _bridged_call(kernel, call, out_structs, arrays)
        return _unflatten(structure, iter(result))

    setattr(bridged, BRIDGE_ATTR, Bridge("torch", str(dev), threads))
    return bridged


def _bridged_call(kernel: _TorchKernel, call: _Call, out_structs, arrays):
    """The output leaves of fn on arrays, differentiable by torch's autograd."""
    in_dtypes = tuple(np.dtype(a.dtype) for a in arrays)
    floats_in = tuple(_is_float(d) for d in in_dtypes)
    float_outs = tuple(i for i, s in enumerate(out_structs) if _is_float(s.dtype))
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
                             for x, is_float in zip(xs, floats_in) if is_float)
        wires = jax.pure_callback(
            functools.partial(kernel.vjp, call, in_dtypes, ct_dtypes),
            tuple(map(_wire_struct, grad_structs)), *map(_onto_wire, xs),
            *(_onto_wire(cts[i]) for i in float_outs), vmap_method="sequential")
        grads = iter(_off_wire(w, s.dtype) for w, s in zip(wires, grad_structs))
        return tuple(next(grads) if is_float else None for is_float in floats_in)

    run.defvjp(run_fwd, run_bwd)
    return run(*arrays)
