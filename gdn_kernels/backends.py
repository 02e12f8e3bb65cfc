"""The one implementation switch for the chunked algorithm.

A backend is a module with
  forward(q, k, v, g, beta, s0, scale, chunk) -> (o, final_state, residuals)
  backward(q, k, v, g, beta, residuals, do, ds_final, scale, chunk)
      -> (dq, dk, dv, dg, dbeta, ds0)
in the contract layout, all outputs in the accumulation dtype.
"""

from __future__ import annotations

import importlib

CHUNKED_BACKENDS = {
    "xla": "gdn_kernels.xla_impl",
    "pallas": "gdn_kernels.pallas_impl",
}


def get_backend(impl: str):
    """The backend module of a chunked impl ("xla" or "pallas")."""
    try:
        name = CHUNKED_BACKENDS[impl]
    except KeyError:
        raise ValueError(f"impl must be one of {tuple(CHUNKED_BACKENDS)} here, "
                         f"got {impl!r}") from None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise
        raise NotImplementedError(
            f"impl={impl!r} is not implemented yet; use impl='xla' "
            f"(chunked, hand-written VJP) or impl='reference' (token scan)") from None
