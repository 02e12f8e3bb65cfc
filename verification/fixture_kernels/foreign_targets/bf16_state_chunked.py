"""A foreign target: bf16_compute_chunked's kernel with its recurrent state
kept in bfloat16 between chunks (rounded after every chunk's update), as
some kernels in the field do; it declares so (compute_precision
"bfloat16-state"): its bfloat16 cases are judged against the token scan
that rounds the state too, and its state's distance from the contract's
float32 state is listed as deviation rows."""

import functools

from verification.targets.declaration import KernelDeclaration, Supports

from . import bf16_compute_chunked as _chunked


GDN_KERNEL = KernelDeclaration(
    gated_delta_rule=functools.partial(_chunked.gated_delta_rule, state_dtype="bfloat16"),
    gdn_decoupled_conv1d=functools.partial(_chunked.gdn_decoupled_conv1d,
                                           state_dtype="bfloat16"),
    supports=Supports(segment_ids=False, compute_precision="bfloat16-state",
                      chunk_sizes=_chunked.CHUNK_SIZES))
