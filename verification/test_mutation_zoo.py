"""Meta-tests: the suite can fail. Every property is shown failing on a
deliberately wrong target (a seeded-bug mutant of gdn_kernels, or a wrapper
in verification/wrong_targets), and for the three bugs this project exists
to catch, the counterexample file written on failure replays to the same
failure (and passes on the correct target)."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from . import counterexamples, harness
from .cli import replay
from .properties import PROPERTIES, PropertyFailure
from .suite import SUITE
from .targets import Target

# property -> a wrong target that must make it fail
WRONG_TARGET = {
    "mixer_forward_parity": "gdn_mutant_beta_applied_twice:xla",
    "delta_rule_forward_parity": "gdn_mutant_no_decay_between_chunks:xla",
    "mixer_gradient_parity": "gdn_mutant_conv_bwd_shift_by_one:xla",
    "delta_rule_gradient_parity": "gdn_mutant_dinitial_state_dropped:xla",
    "near_zero_rows_vjp_parity": "gdn_mutant_l2norm_bwd_eps_1e12:xla",
    "vjp_matches_finite_differences": "gdn_mutant_l2norm_bwd_eps_1e12:xla",
    "l2norm_scale_invariance": "gdn_mutant_l2norm_bwd_hardcoded_eps:xla",
    "cotangent_shapes_and_dtypes": "gdn_mutant_param_grad_axis_01:xla",
    "param_gradient_is_broadcast_sum": "gdn_mutant_param_grad_axis_01:xla",
    "chunk_size_invariance": "gdn_mutant_inverse_offdiag_block_sign:xla",
    "split_invariance": "gdn_mutant_tail_padded_with_edge_tokens:xla",
    "causality": "gdn_mutant_conv_forward_looks_ahead:xla",
    "batch_independence": "gdn_mutant_l2norm_sums_over_batch:xla",
    "gva_equals_explicit_repeat": "gdn_mutant_gva_tile_not_repeat:xla",
    "determinism": "verification.wrong_targets.nondeterministic",
    "unstable_no_spurious_nan": "gdn_mutant_mask_after_exp:xla",
    "bad_input_raises_named_error": "verification.wrong_targets.unvalidated",
}

_FAST = dict(deadline=None, derandomize=True, database=None, max_examples=40,
             suppress_health_check=list(HealthCheck))


def _hunt(prop: str, target: Target, shrink: bool):
    """Run the property's own strategy against `target`; return the failure."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @settings(phases=phases, **_FAST)
    @given(case=SUITE[prop].strategy)
    def hunt(case):
        harness.check_property(prop, target, case, record=False)

    harness.LAST_FAILURE.clear()
    with pytest.raises(Exception) as info:
        hunt()
    return info.value


def test_every_property_of_the_suite_has_a_wrong_target():
    assert set(WRONG_TARGET) == set(SUITE)


@pytest.mark.parametrize("prop", sorted(WRONG_TARGET))
def test_property_fails_on_its_wrong_target(prop):
    err = _hunt(prop, Target.parse(WRONG_TARGET[prop]), shrink=False)
    assert prop in harness.LAST_FAILURE, f"{prop} did not record a failing case: {err!r}"


ROUND_TRIPS = [
    ("near_zero_rows_vjp_parity", "gdn_mutant_l2norm_bwd_eps_1e12:xla"),        # eps 1e-12 vs 1e-6
    ("cotangent_shapes_and_dtypes", "gdn_mutant_param_grad_axis_01:xla"),       # axis=(0, 1)
    ("delta_rule_forward_parity", "gdn_mutant_tail_padded_with_edge_tokens:xla"),  # tail chunk
]


@pytest.mark.parametrize("prop, wrong", ROUND_TRIPS)
def test_counterexample_file_replays_to_the_same_failure(prop, wrong, tmp_path, capsys):
    target = Target.parse(wrong)
    _hunt(prop, target, shrink=True)
    case, failing_target, rows = harness.LAST_FAILURE[prop]
    path = counterexamples.write(prop, case, failing_target.spec, "test", rows,
                                 "", folder=str(tmp_path))
    record = counterexamples.load(path)
    assert record["case_obj"] == case and record["target"] == wrong
    assert replay(path, None) == 1                      # still fails on the wrong target
    assert "STILL FAILS" in capsys.readouterr().out
    assert replay(path, "gdn_kernels:xla") == 0         # and holds on the real one
    with pytest.raises(Exception) as again:   # the same failure, rerun directly
        PROPERTIES[prop].check(target, record["case_obj"])
    if rows:
        assert isinstance(again.value, PropertyFailure)
