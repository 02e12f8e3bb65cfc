"""Independent gated-delta-rule kernels written in foreign conventions (test fixtures)."""
