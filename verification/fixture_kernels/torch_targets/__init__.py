"""Kernels written in PyTorch (no gdn_kernels imported), made targets by
verification.from_torch and verification.adapt: the torch bridge's own
fixtures (verification/tests/test_torch_bridge.py). They need torch
installed (the `[torch]` extra).

token_scan                  the gated delta rule token by token, in fla's
                            conventions (equal heads, a log decay, no chunk
                            size, no packed rows), plain torch autograd;
                            computes float32 (float64 for float64 inputs)
token_scan_decay_after_update  the same with a planted bug: each step's
                            decay applied after its update, not before
chunked_wy                  the same recurrence by chunks (the WY form), with a
                            chunk_size argument and a hand-written
                            autograd.Function backward (chunks last to first,
                            each recomputed from its entering state)
chunked_wy_state_cotangent_not_carried  the same with a planted bug in its
                            backward: the state cotangent not carried into
                            the chunk before
token_scan_bf16_compute     a token scan computing bfloat16 inputs in bfloat16
                            (products rounded to bfloat16, float32 state),
                            declared so (compute_precision "bfloat16")
jax_twin                    token_scan's math in JAX, same conventions and
                            adapters: the bridge overhead benchmark's baseline
"""
