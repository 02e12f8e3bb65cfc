"""Correct implementations of the contract that are NOT gdn_kernels.

They exist to check the suite itself: a property must never fail a correct
foreign target for its own numerical reasons. Run one with
`--gdn-target verification.foreign_targets.float32_only_scan` (or
`...float32_compute_scan`).

float32_only_scan     token scan in float32, plain autodiff; refuses float64.
float32_compute_scan  the same math; accepts float64 inputs but computes in
                      float32 and casts the results back (float64 carrying
                      float32 noise).
"""
