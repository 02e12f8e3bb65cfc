"""A foreign target: bf16_compute_chunked's kernel solving its chunk matrix
with jaxlib's batched LAPACK triangular solve (lax.linalg.triangular_solve
on [chunks, B, H, C, C], in the forward and, by plain autodiff, in the
backward), as many kernels in the field do.

On XLA:CPU that solve splits its batch over the intra-op thread pool and
waits for the pieces inside a pool thread, so two solves a program runs at
once on a 2-thread pool wait for each other for ever: the ci profile's run
of this target on 2 workers hangs (benchmarks/results/cpu-2core-epyc/
pool-deadlock.md), and the watchdog (verification/engine/watchdog.py)
reports such an example as hung."""

import functools

from verification.targets.declaration import KernelDeclaration, Supports

from . import bf16_compute_chunked as _chunked


GDN_KERNEL = KernelDeclaration(
    gated_delta_rule=functools.partial(_chunked.gated_delta_rule, solve="lapack"),
    gdn_decoupled_conv1d=functools.partial(_chunked.gdn_decoupled_conv1d, solve="lapack"),
    supports=Supports(segment_ids=False, compute_precision="bfloat16",
                      chunk_sizes=_chunked.CHUNK_SIZES))
