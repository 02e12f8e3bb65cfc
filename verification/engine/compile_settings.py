"""How the suite's processes ask XLA:CPU to compile: fast, not optimised.

The suite is compile-bound: a property example builds new programs of a few
hundred tokens, compiles them for 1-5 s and runs them in milliseconds (the
summary's "compile s" column is nearly all of "time s"). So every process of
the suite (the pytest session and its xdist workers, the mesh worker, the
mutation runner's processes, `gdn-verify replay`) compiles with

  --xla_cpu_use_fusion_emitters=false   XLA:CPU's loop emitters instead of
                                        its MLIR fusion emitters
  --xla_backend_optimization_level=0    LLVM without optimisation passes
  --xla_cpu_parallel_codegen_split_count=1
                                        one LLVM module per program, not
                                        split for parallel code generation

Measured here (2-core CPU, jaxlib 0.10.2), the backend compile of the mixer's
fwd+bwd at four lattice shapes (pallas, xla, float64 oracle): 19.5 s with
XLA's defaults, 3.8 s with both flags; five properties of the dev profile:
103 s -> 34 s. The programs are the same HLO, optimised by the same HLO
passes; only code generation differs, and with it the order of some float
operations (fused multiply-adds, vector reductions). The split count changes
only how the program's code is cut into object files: on two cores the
split's threads competed with the other xdist worker, and every part is its
own set of memory maps. Measured (2026-12-03, same machine): the ci
profile's properties on 2 workers, cold cache, 222 s -> 187 s (432 -> 355
test-seconds); 161 -> 68 memory maps per program (target and oracle VJP
programs of the mixer at eight shapes), so the executable release of
runners.release_executables_if_needed comes 2.4x less often. On a mixer case the
float32 gradients of both builds are 6e-8..5e-7 (relative L2) from the
float64 oracle and 1.5e-7..6e-7 from each other: float32 rounding in
another order, under half the policy's float32 floor (2e-6);
verification/tests/test_compile_settings.py keeps that checked.

The flags are added to XLA_FLAGS, before the process's first computation,
only where they are known to exist (an unknown XLA flag aborts the process)
and only on a machine without an accelerator plugin (the flags concern the
CPU backend; kernels compiled for a TPU or GPU are left to XLA's defaults).
GDN_XLA_DEFAULTS=1 turns them off (XLA's defaults: slower compiles,
optimised code), e.g. to rerun a counterexample exactly as a model would run.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import MutableMapping, Optional

SUITE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0",
               "--xla_cpu_parallel_codegen_split_count=1")
# jaxlib versions on which the flags were checked to exist and measured.
VERIFIED_JAXLIB = ("0.10.",)
OPT_OUT_ENV = "GDN_XLA_DEFAULTS"


def _jaxlib_version() -> str:
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _accelerator_plugin() -> Optional[str]:
    """The name of an installed TPU/GPU plugin of JAX, or None."""
    if importlib.util.find_spec("libtpu") is not None:
        return "libtpu"
    for ep in importlib.metadata.entry_points(group="jax_plugins"):
        return ep.name
    return None


def why_not_applied(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """None when the suite's flags apply to this process, else the reason."""
    if environ.get(OPT_OUT_ENV, "") not in ("", "0"):
        return f"{OPT_OUT_ENV}={environ[OPT_OUT_ENV]}"
    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms and platforms != "cpu":
        return f"JAX_PLATFORMS={platforms}"
    version = _jaxlib_version()
    if not version.startswith(VERIFIED_JAXLIB):
        return f"jaxlib {version or '(not installed)'} is not one the flags were checked on"
    plugin = _accelerator_plugin()
    if plugin:
        return f"accelerator plugin {plugin} installed"
    return None


def apply(environ: MutableMapping[str, str] = os.environ) -> str:
    """Add SUITE_FLAGS to XLA_FLAGS (those not already there) unless
    why_not_applied; returns a one-line description for the report header.
    Child processes inherit the flags through the environment."""
    reason = why_not_applied(environ)
    if reason:
        return f"XLA's default compile settings ({reason})"
    present = environ.get("XLA_FLAGS", "").split()
    names = {flag.split("=")[0] for flag in present}
    added = [flag for flag in SUITE_FLAGS if flag.split("=")[0] not in names]
    if added:
        environ["XLA_FLAGS"] = " ".join(present + added)
    return f"XLA:CPU compiles unoptimised for speed ({' '.join(SUITE_FLAGS)}; {OPT_OUT_ENV}=1: defaults)"
