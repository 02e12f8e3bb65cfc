"""Meta-tests: no false alarms. Correct implementations of the contract
that are not ours (verification/fixture_kernels/foreign_targets: token scans in float32 with
plain autodiff, one refusing float64 inputs, one accepting float64 but
computing in float32; chunked kernels computing bfloat16 inputs in bfloat16,
declared so, one keeping its state in float32, one in bfloat16; a token scan
and a chunked kernel with a hand-written backward written in PyTorch, and a
torch scan computing bfloat16 inputs in bfloat16, declared so, through the
torch bridge; a token scan in MLX through the MLX bridge) pass every
registered property on a few derandomized examples plus the property's
explicit examples that fit them; a target declaring a compute precision
also on a few bfloat16 examples (those its declaration is about). A
property that fails them fails a correct user for its own numerical
reasons."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from ..engine import harness
from ..engine.registry import PROPERTIES
from ..properties import load_all
from ..targets import Target
from ..tolerance import CONTRACT_PRECISION
from . import WITHOUT_MLX, WITHOUT_TORCH

load_all()

FOREIGN_TARGETS = ("verification.fixture_kernels.foreign_targets.float32_only_scan",
                   "verification.fixture_kernels.foreign_targets.float32_compute_scan",
                   "verification.fixture_kernels.foreign_targets.bf16_compute_chunked",
                   "verification.fixture_kernels.foreign_targets.bf16_state_chunked",
                   pytest.param("verification.fixture_kernels.torch_targets.token_scan",
                                marks=WITHOUT_TORCH),
                   pytest.param("verification.fixture_kernels.torch_targets.chunked_wy",
                                marks=WITHOUT_TORCH),
                   pytest.param("verification.fixture_kernels.torch_targets."
                                "token_scan_bf16_compute", marks=WITHOUT_TORCH),
                   pytest.param("verification.fixture_kernels.mlx_targets.token_scan",
                                marks=WITHOUT_MLX))
# Targets whose float32 path is another's (bf16_compute_chunked's): bfloat16 examples only.
BFLOAT16_ONLY = ("verification.fixture_kernels.foreign_targets.bf16_state_chunked",)
EXAMPLES_PER_PROPERTY = 2
# bfloat16 examples of a target declaring a compute precision, per property
# (the explicit tests of its precision: verification/tests/test_declared_precision.py)
BFLOAT16_EXAMPLES = 1


@pytest.mark.parametrize("spec", FOREIGN_TARGETS)
@pytest.mark.parametrize("prop_id", sorted(PROPERTIES))
def test_correct_foreign_target_passes(prop_id, spec):
    p = PROPERTIES[prop_id]
    target = Target.parse(spec)

    def run(strategy, examples=EXAMPLES_PER_PROPERTY):
        @settings(max_examples=examples, derandomize=True, database=None,
                  deadline=None, suppress_health_check=list(HealthCheck),
                  phases=[Phase.generate])
        @given(case=strategy)
        def check(case):
            harness.check_property(prop_id, target, case, record=False)
        check()

    if spec not in BFLOAT16_ONLY:
        for case in p.examples:          # the regressions, float32 ones only:
            if case.dtype == "float32":  # their shapes are few, their compiles cheap
                harness.check_property(prop_id, target, case, record=False)
        run(p.strategy)
    if target.declaration.supports.compute_precision != CONTRACT_PRECISION:
        try:
            run(p.strategy.filter(lambda c: getattr(c, "dtype", "") == "bfloat16"),
                examples=BFLOAT16_EXAMPLES)
        except Unsatisfiable:          # the property draws no bfloat16 case
            pass
