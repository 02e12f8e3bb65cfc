"""Kernels written in MLX (no gdn_kernels imported), made targets by
verification.from_mlx and verification.adapt: the MLX bridge's fixtures
(verification/tests/test_mlx_bridge.py). They need MLX installed (the
`[mlx]` extra; MLX's CPU build on Linux).

token_scan                  the gated delta rule token by token, in fla's
                            conventions (equal heads, a log decay, no chunk
                            size, no packed rows), MLX's autodiff; computes
                            float32 (float64 for float64 inputs)
token_scan_decay_after_update  the same with a planted bug: each step's
                            decay applied after its update, not before
"""
