"""How Pallas kernels run: the GDN_INTERPRET environment variable, read at
trace time (docs/contract.md section 4).

  auto     (default) compile on TPU, `hlo` interpret mode elsewhere
  hlo      interpret=True: the kernel becomes an ordinary XLA program
  tpu-sim  pltpu.InterpretParams: TPU memory simulated, out-of-bounds reads
           raise, uninitialised memory reads as NaN
  off      never interpret (compile for the backend; lets a CPU-only machine
           lower for TPU with lowering_platforms=("tpu",))
"""

from __future__ import annotations

import os

import jax

ENV_VAR = "GDN_INTERPRET"
MODES = ("auto", "hlo", "tpu-sim", "off")


def interpret_mode() -> str:
    """The requested mode, validated (default "auto")."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {MODES}, got {mode!r}")
    return mode


def resolved_mode() -> str:
    """`auto` resolved against the default backend: "off" on TPU, else "hlo"."""
    mode = interpret_mode()
    if mode == "auto":
        return "off" if jax.default_backend() == "tpu" else "hlo"
    return mode


def pallas_interpret_arg(mode: str):
    """The value for pl.pallas_call(..., interpret=...) in a resolved mode
    (resolved_mode(), read when the op is called and kept in its static
    configuration: the kernel never reads the environment at trace time)."""
    if mode not in MODES[1:]:
        raise ValueError(f"a Pallas kernel needs a resolved interpret mode "
                         f"{MODES[1:]}, got {mode!r}")
    if mode == "hlo":
        return True
    if mode == "off":
        return False
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.InterpretParams(out_of_bounds_reads="raise",
                                 uninitialized_memory="nan")
