"""A known imprecision its author accepts by a declared tolerance: the float32
scan of verification.fixture_kernels.foreign_targets.float32_only_scan with the mixer's
a_log cotangent off by a relative 1e-3 (hundreds of times float32's bound
for it, far inside 1e4 times), declared as KernelDeclaration.tolerance
{"da_log": 1e4}. Every property holds, da_log listed "held at the declared
tolerance"; imprecise_a_log_gradient_tight declares x2 for the same kernel,
and fails (verification/tests/test_tolerance.py)."""

from __future__ import annotations

import jax

from verification import KernelDeclaration, Supports

from ..foreign_targets import float32_only_scan as _scan

RELATIVE_ERROR = 1e-3


@jax.custom_vjp
def _a_log_cotangent_off(a_log):
    """The identity on a_log; its VJP scales the cotangent by 1 + RELATIVE_ERROR."""
    return a_log


def _fwd(a_log):
    return a_log, None


def _bwd(_, ct):
    return (ct * (1 + RELATIVE_ERROR),)


_a_log_cotangent_off.defvjp(_fwd, _bwd)


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, **kw):
    return _scan.gdn_decoupled_conv1d(x, conv_weight, a, b, _a_log_cotangent_off(a_log),
                                      dt_bias, **kw)


def declared(factor: float) -> KernelDeclaration:
    """The layer (no core op), float32 only, accepting da_log within `factor`."""
    return KernelDeclaration(gdn_decoupled_conv1d=gdn_decoupled_conv1d,
                             supports=Supports(dtypes=("float32",)),
                             tolerance={"da_log": factor})


GDN_KERNEL = declared(1e4)
