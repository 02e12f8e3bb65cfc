"""Hypothesis strategies for the GDN contract. Cases are plain data
(`cases`), arrays are built from them deterministically (`inputs`)."""

from .cases import (DeltaRuleCase, MixerCase, NearZeroRow, case_from_json,
                    case_repr, case_to_json)
from . import explicit, segments, shapes
from .composite import delta_rule_cases, mixer_cases, near_zero_rows
from .lattice import delta_geometries, mixer_geometries
from .inputs import cotangent, delta_rule_inputs, mixer_inputs, segment_ids_of
from .segments import (LAYOUT_FEATURES, documents, layout_features, padding_mask,
                       segment_ids, segment_layouts)

__all__ = [
    "DeltaRuleCase", "MixerCase", "NearZeroRow", "case_from_json", "case_repr",
    "case_to_json", "delta_rule_cases", "mixer_cases", "near_zero_rows",
    "cotangent", "delta_rule_inputs", "mixer_inputs", "delta_geometries",
    "mixer_geometries", "explicit", "shapes", "segments", "segment_ids_of",
    "LAYOUT_FEATURES", "documents", "layout_features", "padding_mask", "segment_ids",
    "segment_layouts",
]
