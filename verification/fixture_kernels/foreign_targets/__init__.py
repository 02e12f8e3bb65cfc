"""Correct implementations of the contract that are NOT gdn_kernels.

They exist to check the suite itself: a property must never fail a correct
foreign target for its own numerical reasons. Run one with
`--gdn-target verification.fixture_kernels.foreign_targets.float32_only_scan` (or
`...float32_compute_scan`).

float32_only_scan     token scan in float32, plain autodiff; refuses float64.
float32_compute_scan  the same math; accepts float64 inputs but computes in
                      float32 and casts the results back (float64 carrying
                      float32 noise).
bf16_compute_chunked  chunked WY computing bfloat16 inputs in bfloat16 (float32
                      state), declared so (compute_precision "bfloat16"); chunk
                      sizes up to 256, beyond the contract.
bf16_state_chunked    the same with its state kept in bfloat16, declared
                      "bfloat16-state".
lapack_solve_chunked  bf16_compute_chunked solving its chunk matrix with
                      jaxlib's batched LAPACK triangular solve.
aborts_at_teardown    gdn_kernels' XLA twin in a module that aborts its
                      process at interpreter teardown, as a framework's
                      runtime can; import it only in a process run for it.
"""
