"""from_mlx: an MLX function made a JAX function the suite calls.

    from verification import adapt, from_mlx

    GDN_KERNEL = adapt(from_mlx(my_mlx_kernel), heads="equal", ...)

`from_mlx(fn)` returns a function of fn's own signature and conventions
over JAX arrays (verification/targets/bridge.py: the callbacks, the
arguments, the outputs, 64-bit values). Its VJP is `mlx.core.vjp` of fn
with the suite's cotangents (fn's own gradients, a custom_function's vjp
included). Dtypes are carried exactly: float64 stays float64 (MLX's CPU
computes it), bfloat16 stays bfloat16 (bit views through ml_dtypes).

Device: "auto" leaves MLX's default device (the GPU where MLX has one),
"cpu" or "gpu" runs every call on that device's default stream. MLX
evaluates lazily: the outputs' shapes and dtypes are read off a call on
zeros that is never evaluated.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Tuple

import jax
import ml_dtypes
import numpy as np

from .bridge import Bridge, Call, HostKernel, bridged_function, flatten, from_wire, to_wire


def _mlx():
    try:
        import mlx.core as mx
    except ImportError as err:
        raise ImportError("from_mlx needs MLX: pip install 'gdn-verify[mlx]' (or mlx itself) "
                          f"({err})") from None
    return mx


class MlxKernel(HostKernel):
    """fn run in MLX on numpy arrays: its forward, its VJP by mlx.core.vjp,
    and its outputs' shapes and dtypes (a lazy call on zeros)."""

    def __init__(self, mx, fn: Callable, device):
        self.mx, self.fn, self.device = mx, fn, device

    def _on_device(self):
        return contextlib.nullcontext() if self.device is None else self.mx.stream(self.device)

    def _dtype(self, dtype):
        """The MLX dtype of a numpy dtype (given explicitly: MLX would take
        a float64 array as float32)."""
        dtype = np.dtype(dtype)
        if dtype == ml_dtypes.bfloat16:
            return self.mx.bfloat16
        if dtype == np.bool_:
            return self.mx.bool_
        try:
            return getattr(self.mx, dtype.name)
        except AttributeError:
            raise TypeError(f"from_mlx: no MLX dtype for {dtype}") from None

    def _numpy_dtype(self, dtype):
        return np.dtype(ml_dtypes.bfloat16) if dtype == self.mx.bfloat16 \
            else np.dtype(str(dtype).rsplit(".", 1)[-1].replace("bool_", "bool"))

    def _array(self, array: np.ndarray):
        mx = self.mx
        array = np.ascontiguousarray(array)
        if array.dtype == ml_dtypes.bfloat16:
            return mx.array(array.view(np.uint16)).view(mx.bfloat16)
        return mx.array(array, dtype=self._dtype(array.dtype))

    def _numpy(self, x) -> np.ndarray:
        mx = self.mx
        if x.dtype == mx.bfloat16:
            return np.array(x.view(mx.uint16)).view(ml_dtypes.bfloat16)
        return np.array(x)

    def _leaves(self, out):
        return flatten(out, lambda x: isinstance(x, self.mx.array), "mlx")

    def _run(self, call: Call, arrays):
        args, kwargs = call.arguments(arrays)
        return self.fn(*args, **kwargs)

    def _is_float(self, x) -> bool:
        return self.mx.issubdtype(x.dtype, self.mx.floating)

    def output_structure(self, call: Call, specs) -> Tuple[Any, Tuple[jax.ShapeDtypeStruct, ...]]:
        mx = self.mx
        with self._on_device():
            leaves, structure = self._leaves(self._run(call, [
                mx.zeros(shape, dtype=self._dtype(dtype)) for shape, dtype in specs]))
        return structure, tuple(jax.ShapeDtypeStruct(tuple(x.shape), self._numpy_dtype(x.dtype))
                                for x in leaves)

    def forward(self, call: Call, in_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        with self._on_device():
            arrays = [self._array(from_wire(w, d)) for w, d in zip(wires, in_dtypes)]
            leaves, _ = self._leaves(self._run(call, arrays))
            self.mx.eval(leaves)
        return tuple(to_wire(self._numpy(x)) for x in leaves)

    def vjp(self, call: Call, in_dtypes, ct_dtypes, *wires) -> Tuple[np.ndarray, ...]:
        mx = self.mx
        n = len(in_dtypes)
        with self._on_device():
            arrays = [self._array(from_wire(w, d)) for w, d in zip(wires[:n], in_dtypes)]
            cts = [self._array(from_wire(w, d)) for w, d in zip(wires[n:], ct_dtypes)]
            wrt = [i for i, x in enumerate(arrays) if self._is_float(x)]

            def float_outputs(*primals):
                filled = list(arrays)
                for i, x in zip(wrt, primals):
                    filled[i] = x
                leaves, _ = self._leaves(self._run(call, filled))
                return [x for x in leaves if self._is_float(x)]

            if not wrt or not cts:
                grads = [mx.zeros_like(arrays[i]) for i in wrt]
            else:
                _, grads = mx.vjp(float_outputs, [arrays[i] for i in wrt], cts)
            mx.eval(grads)
        return tuple(to_wire(self._numpy(g)) for g in grads)


def from_mlx(fn: Callable, *, device: str = "auto") -> Callable:
    """fn, an MLX function, as a JAX function of the same signature (see the
    module docstring): forward by a host callback, VJP by mlx.core.vjp.
    device: "auto" (MLX's default), "cpu" or "gpu"."""
    mx = _mlx()
    if not callable(fn):
        raise TypeError(f"from_mlx: fn must be callable, got {type(fn).__name__}")
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"from_mlx: device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    dev = None if device == "auto" else getattr(mx, device)
    where = str(mx.default_device() if dev is None else dev)
    return bridged_function(fn, MlxKernel(mx, fn, dev), Bridge("mlx", where))
