"""The one implementation switch for the chunked algorithm.

A backend is a module with
  forward(q, k, v, g, beta, s0, scale, chunk, seg=None)
      -> (o, final_state, residuals)
  backward(q, k, v, g, beta, residuals, do, ds_final, scale, chunk, seg=None)
      -> (dq, dk, dv, dg, dbeta, ds0)
in the contract layout, all outputs in the accumulation dtype. Short calls
(T <= RECURRENT_MAX_T, decode) run on recurrent_impl whatever the impl. seg is a
segments.Segments of packed documents or None; the caller zeroes padding
tokens (inputs, do, cotangents), the backend resets the state at document
starts.
"""

from __future__ import annotations

import importlib

from .recurrent_impl import RECURRENT_MAX_T

# Module names relative to this package (so a renamed copy of the package,
# e.g. a seeded-bug mutant, uses its own backends).
CHUNKED_BACKENDS = {
    "xla": ".xla_impl",
    "pallas": ".pallas_impl",
}


def get_backend(impl: str):
    """The backend module of a chunked impl ("xla" or "pallas")."""
    try:
        name = CHUNKED_BACKENDS[impl]
    except KeyError:
        raise ValueError(f"impl must be one of {tuple(CHUNKED_BACKENDS)} here, "
                         f"got {impl!r}") from None
    return importlib.import_module(__package__ + name)


def backend_for(impl: str, seq_len: int):
    """The backend a call of T = seq_len tokens runs on: the token-by-token
    decode path (recurrent_impl) for T <= RECURRENT_MAX_T, whatever the
    impl; else the impl's chunked backend."""
    if seq_len <= RECURRENT_MAX_T:
        return importlib.import_module(__package__ + ".recurrent_impl")
    return get_backend(impl)
