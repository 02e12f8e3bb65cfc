"""Deliberately wrong implementations of the contract that no source patch
of gdn_kernels expresses well (they wrap the real one). Used to show that
the determinism and bad-input properties can fail."""
