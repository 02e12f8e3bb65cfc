"""A foreign target: float32_only_scan's math, but it ACCEPTS float64 inputs.

It still computes everything in float32 and casts the results back: o in
v's / x's dtype, final_state in float64 for float64 inputs (float32
otherwise), every cotangent in its primal's dtype. So float64 in gives
float64 out carrying float32 rounding noise, a legitimate (if unhelpful)
choice: float64 is outside the contract's dtypes.
"""

from __future__ import annotations

import functools

from . import float32_only_scan as _scan

gated_delta_rule = functools.partial(_scan.gated_delta_rule, accept_float64=True)
gdn_decoupled_conv1d = functools.partial(_scan.gdn_decoupled_conv1d, accept_float64=True)
l2norm_forward = _scan.l2norm_forward
l2norm_backward = _scan.l2norm_backward
