"""The suite's properties, one module per family; importing this package
registers them all in verification.engine.registry.PROPERTIES.

  parity             outputs and every gradient vs the float64 oracle
  eps                QK L2-norm eps consistency: near-zero rows, finite
                     differences of the target's own forward, scale invariance
  reduced_gradients  a_log / dt_bias cotangent shapes and broadcast sums
  metamorphic        chunk size, split, causality, batch rows, GVA, determinism
  packing            packed documents == documents alone, padding transparent
                     with exactly-zero cotangents, packed oracle parity
  state              carried GDNState: split calls and decode == one call
  sharding           the ops over a device mesh == one device, and communicate
                     only as the contract allows
  stability          no spurious NaN on expanding recurrences
  bad_input          contract violations raise named errors
  conventions        dtypes and shapes as the target's own code returns them
                     (an adapter's casts are convention deviations)
"""

from typing import Dict

# Import order is test order: parity first.
from . import parity, eps, reduced_gradients, metamorphic, packing, state, sharding, stability, bad_input, conventions  # noqa: F401,I001,E501
from ..engine.registry import PROPERTIES, Property, PropertyFailure

__all__ = ["PROPERTIES", "PropertyFailure", "load_all"]


def load_all() -> Dict[str, Property]:
    """Every registered property (importing this package registered them)."""
    return PROPERTIES
