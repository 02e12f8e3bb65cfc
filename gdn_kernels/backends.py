"""The one table of implementations (`impl=`), and the switch for the
chunked algorithm.

BACKENDS: impl name -> Backend(module, interprets). Validation, the API,
the benchmarks and the seeded-bug mutants read it; adding an impl is one
entry here and one module. A chunked backend's module has
  forward(q, k, v, g, beta, s0, scale, settings, seg=None)
      -> (o, final_state, residuals)
  backward(q, k, v, g, beta, residuals, do, ds_final, scale, settings, seg=None)
      -> (dq, dk, dv, dg, dbeta, ds0)
in the contract layout, all outputs in the accumulation dtype; settings is
a KernelSettings (the chunk size and the Pallas kernels' settings, static
arguments as JAX's own Pallas ops take block sizes and interpret=). Short calls
(T <= RECURRENT_MAX_T, decode) run on recurrent_impl whatever the impl. seg is a
segments.Segments of packed documents or None; the caller zeroes padding
tokens (inputs, do, cotangents), the backend resets the state at document
starts.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, NamedTuple, Optional

from .recurrent_impl import RECURRENT_MAX_T

# Value rows (batch row, value head) a Pallas grid step works on: the most
# whose [Dk, Dv] states take at most this many bytes (pallas_impl.step_block).
# One step's VMEM is about 10x its states (double-buffered streams and
# output blocks): 512 KiB keeps it near 5 MiB.
STATE_BYTES_PER_STEP = 512 * 1024


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """Static settings of one chunked-backend call (part of every jit key).

    chunk:                tokens per chunk
    interpret:            the resolved GDN_INTERPRET mode the Pallas kernels
                          run in ("hlo", "tpu-sim", "off"; "n/a" elsewhere)
    state_bytes_per_step: the [Dk, Dv] state bytes a Pallas grid step holds
    """
    chunk: int
    interpret: str = "n/a"
    state_bytes_per_step: int = STATE_BYTES_PER_STEP


def kernel_settings(cfg) -> KernelSettings:
    """The KernelSettings of a DeltaRuleConfig or MixerConfig."""
    return KernelSettings(cfg.chunk_size, cfg.interpret, cfg.state_bytes_per_step)


class Backend(NamedTuple):
    """One implementation of the ops.

    module:     its forward/backward module, relative to this package (so a
                renamed copy of the package, e.g. a seeded-bug mutant, runs
                its own), or None: the oracle's token scan, plain autodiff
    interprets: its kernels are Pallas kernels (GDN_INTERPRET applies)
    """
    module: Optional[str]
    interprets: bool = False


BACKENDS = {
    "pallas": Backend(".pallas_impl", interprets=True),
    "xla": Backend(".xla_impl"),
    "reference": Backend(None),
}
# The impls that run the chunked algorithm (custom VJP, forward/backward).
CHUNKED = tuple(name for name, b in BACKENDS.items() if b.module is not None)


class ChunkedOps(NamedTuple):
    """A chunked backend's pair (see the module docstring for signatures)."""
    forward: Callable
    backward: Callable


def _ops(module: str) -> ChunkedOps:
    mod = importlib.import_module(__package__ + module)
    return ChunkedOps(mod.forward, mod.backward)


def get_backend(impl: str) -> ChunkedOps:
    """The forward/backward pair of a chunked impl (one of CHUNKED)."""
    if impl not in CHUNKED:
        raise ValueError(f"impl must be one of {CHUNKED} here, got {impl!r}")
    return _ops(BACKENDS[impl].module)


def backend_for(impl: str, seq_len: int) -> ChunkedOps:
    """The pair a call of T = seq_len tokens runs on: the token-by-token
    decode path (recurrent_impl) for T <= RECURRENT_MAX_T, whatever the
    impl; else the impl's chunked backend."""
    if seq_len <= RECURRENT_MAX_T:
        return _ops(".recurrent_impl")
    return get_backend(impl)
