"""A wrong target: the bfloat16-compute kernel (foreign_targets.bf16_compute_chunked)
WITHOUT its declaration, so it claims the contract's float32 compute and
state: its bfloat16 cases' final state misses the contract's bound by ~1e3
(the declaration, not a looser policy, is what lets the correct kernel
hold)."""

import dataclasses

from verification.fixture_kernels.foreign_targets import bf16_compute_chunked as _chunked

GDN_KERNEL = dataclasses.replace(
    _chunked.GDN_KERNEL,
    supports=dataclasses.replace(_chunked.GDN_KERNEL.supports, compute_precision="float32"))
