"""A wrong target: the bfloat16-state kernel (foreign_targets.bf16_state_chunked)
declared as keeping its state in float32 (compute_precision "bfloat16"):
the state it hands on is rounded to bfloat16 after every chunk, a
deviation from the float32 state it declares."""

import dataclasses

from verification.fixture_kernels.foreign_targets import bf16_state_chunked as _bf16_state

GDN_KERNEL = dataclasses.replace(
    _bf16_state.GDN_KERNEL,
    supports=dataclasses.replace(_bf16_state.GDN_KERNEL.supports, compute_precision="bfloat16"))
