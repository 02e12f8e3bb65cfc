"""Gated DeltaNet kernels for JAX: the contract of docs/contract.md.

impl="reference": token-by-token oracle (plain autodiff, float64-capable);
impl="xla": chunked algorithm with a hand-written VJP;
impl="pallas": the same chunk math as Pallas kernels.
"""

from .api import gated_delta_rule, gdn_decoupled_conv1d
from .l2norm import DEFAULT_EPS, l2norm_backward, l2norm_forward
from .sharded import sharded
from .state import GDNState

# l2norm_forward / l2norm_backward are optional stage hooks beyond the
# contract: the suite's metamorphic eps property checks them when present.
__all__ = ["gated_delta_rule", "gdn_decoupled_conv1d", "GDNState", "sharded", "DEFAULT_EPS",
           "l2norm_forward", "l2norm_backward"]
