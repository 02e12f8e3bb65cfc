"""verification.fixture_kernels.wrong_targets.imprecise_a_log_gradient's kernel with a
declared tolerance of x2 for da_log: its a_log cotangent misses the bound
by far more, and fails."""

from .imprecise_a_log_gradient import declared

GDN_KERNEL = declared(2)
