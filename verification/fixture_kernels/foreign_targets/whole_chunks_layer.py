"""A foreign layer-only target with limits, declared as it is: the float32
scan of float32_only_scan behind the input checks of a layer that reshapes
T into whole chunks and broadcasts a_log / dt_bias with a batch axis only at
a batch of one. It raises ValueError (naming the argument) outside those
shapes; its declaration says so (Limits), so every case drawn for it is one
it takes. `whole_chunks_layer_undeclared` is the same kernel declared
without its limits: its cases outside them raise, and are FAILED, counted
as raised (verification/tests/test_declared_targets.py)."""

from __future__ import annotations

from verification import KernelDeclaration, Limits, Supports

from . import float32_only_scan as _scan

LIMITS = Limits(seq_multiple_of_chunk=True, param_ranks=(1, 2), per_batch_params_at=(1,))


def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, chunk_size=64, **kw):
    batch, tokens = x.shape[0], x.shape[1]
    if tokens % chunk_size:
        raise ValueError(f"x: T={tokens} is not a multiple of chunk_size={chunk_size}")
    for name, p in (("a_log", a_log), ("dt_bias", dt_bias)):
        if p.ndim > 2 or (p.ndim == 2 and p.shape[0] != 1):
            raise ValueError(f"{name}: shape {tuple(p.shape)} is not [Hv] or [1, Hv]")
    return _scan.gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias,
                                      chunk_size=chunk_size, **kw)


GDN_KERNEL = KernelDeclaration(gdn_decoupled_conv1d=gdn_decoupled_conv1d,
                               supports=Supports(carried_state=False), limits=LIMITS)
