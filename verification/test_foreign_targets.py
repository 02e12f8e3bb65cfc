"""Meta-tests: no false alarms. Two correct implementations of the contract
that are not ours (verification/foreign_targets: token scans in float32 with
plain autodiff, one refusing float64 inputs, one accepting float64 but
computing in float32) pass every registered property on a few derandomized
examples plus the property's explicit examples that fit them. A property
that fails them fails a correct user for its own numerical reasons."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from . import harness
from .registry import PROPERTIES
from .properties import load_all
from .targets import Target

load_all()

FOREIGN_TARGETS = ("verification.foreign_targets.float32_only_scan",
                   "verification.foreign_targets.float32_compute_scan")
EXAMPLES_PER_PROPERTY = 2


@pytest.mark.parametrize("spec", FOREIGN_TARGETS)
@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_correct_foreign_target_passes(prop_id, spec):
    p = PROPERTIES[prop_id]
    target = Target.parse(spec)

    @settings(max_examples=EXAMPLES_PER_PROPERTY, derandomize=True, database=None,
              deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @given(case=p.strategy)
    def run(case):
        harness.check_property(prop_id, target, case, record=False)

    for case in p.examples:          # the regressions, float32 ones only:
        if case.dtype == "float32":  # their shapes are few, their compiles cheap
            harness.check_property(prop_id, target, case, record=False)
    run()
