"""from_torch: a PyTorch function made a JAX function the suite calls.

    from verification import adapt, from_torch

    GDN_KERNEL = adapt(from_torch(my_torch_kernel), layout="head_first", ...)

`from_torch(fn)` returns a function of fn's own signature and conventions
over JAX arrays (verification/targets/bridge.py: the callbacks, the
arguments, the outputs, 64-bit values). Its VJP runs fn again under
torch's autograd and asks `torch.autograd.grad` for the input gradients
with the suite's cotangents, so the gradients judged are the kernel's own
(a hand-written `torch.autograd.Function` backward is exactly what is
verified). Dtypes are carried exactly: float64 stays float64, bfloat16
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
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import jax
import ml_dtypes
import numpy as np

from .bridge import Bridge, Call, HostKernel, bridged_function, flatten, from_wire, to_wire


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


class TorchKernel(HostKernel):
    """fn run in torch on numpy arrays: its forward, its VJP by autograd,
    and its outputs' shapes and dtypes (from a run on torch's meta device,
    or on zeros where the kernel cannot run there)."""

    def __init__(self, torch, fn: Callable, device):
        self.torch, self.fn, self.device = torch, fn, device

    def _tensor(self, array: np.ndarray):
        """A numpy array (bfloat16 through an int16 bit view) as a tensor on
        the device; a copy where the array is read-only (JAX's buffers are)."""
        torch = self.torch
        array = np.require(array, requirements=("C", "W"))
        if array.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(array).to(self.device)

    def _array(self, tensor) -> np.ndarray:
        torch = self.torch
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()

    def _dtype(self, dtype) -> Any:
        """The torch dtype of a numpy dtype."""
        torch = self.torch
        if np.dtype(dtype) == ml_dtypes.bfloat16:
            return torch.bfloat16
        try:
            return torch.from_numpy(np.empty((0,), dtype)).dtype
        except TypeError:
            raise TypeError(f"from_torch: no torch dtype for {np.dtype(dtype)}") from None

    def _numpy_dtype(self, dtype):
        if dtype == self.torch.bfloat16:
            return np.dtype(ml_dtypes.bfloat16)
        return self.torch.empty((0,), dtype=dtype).numpy().dtype

    def _leaves(self, out):
        return flatten(out, lambda x: isinstance(x, self.torch.Tensor), "torch")

    def _run(self, call: Call, tensors):
        args, kwargs = call.arguments(tensors)
        return self.fn(*args, **kwargs)

    def output_structure(self, call: Call, specs) -> Tuple[Any, Tuple[jax.ShapeDtypeStruct, ...]]:
        torch = self.torch
        failures = []
        for device, make in (("meta", torch.empty), (self.device, torch.zeros)):
            tensors = [make(shape, dtype=self._dtype(dtype), device=device)
                       for shape, dtype in specs]
            try:
                with torch.no_grad():
                    out = self._run(call, tensors)
            except (NotImplementedError, RuntimeError, ValueError, IndexError) as err:
                failures.append(f"on {device}: {type(err).__name__}: {err}")
                continue
            leaves, structure = self._leaves(out)
            return structure, tuple(jax.ShapeDtypeStruct(tuple(t.shape), self._numpy_dtype(t.dtype))
                                    for t in leaves)
        raise RuntimeError("from_torch: the kernel's output shapes could not be found by "
                           "running it on torch's meta device or on zeros: "
                           + "; ".join(failures))

    def forward(self, call: Call, in_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        torch = self.torch
        tensors = [self._tensor(from_wire(w, d)) for w, d in zip(wires, in_dtypes)]
        with torch.no_grad():
            leaves, _ = self._leaves(self._run(call, tensors))
        return tuple(to_wire(self._array(t)) for t in leaves)

    def vjp(self, call: Call, in_dtypes, ct_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        torch = self.torch
        n = len(in_dtypes)
        tensors = [self._tensor(from_wire(w, d)) for w, d in zip(wires[:n], in_dtypes)]
        cts = [from_wire(w, d) for w, d in zip(wires[n:], ct_dtypes)]
        wrt = [t.requires_grad_(True) for t in tensors if t.is_floating_point()]
        with torch.enable_grad():
            leaves, _ = self._leaves(self._run(call, tensors))
        pairs = [(out, self._tensor(ct))
                 for out, ct in zip((o for o in leaves if o.is_floating_point()), cts)
                 if out.requires_grad]
        grads = [None] * len(wrt)
        if pairs and wrt:
            grads = torch.autograd.grad([o for o, _ in pairs], wrt,
                                        grad_outputs=[c for _, c in pairs], allow_unused=True)
        return tuple(to_wire(self._array(torch.zeros_like(x) if g is None else g))
                     for x, g in zip(wrt, grads))


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
    return bridged_function(fn, TorchKernel(torch, fn, dev), Bridge("torch", str(dev), threads))
