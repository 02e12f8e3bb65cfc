"""Property 5: chunk boundaries and metamorphic relations (and the
stability guard: unstable recurrences must not invent NaNs)."""

from hypothesis import given

from .harness import check_property, examples
from .suite import SUITE


@examples(SUITE["chunk_size_invariance"].weight)
@given(case=SUITE["chunk_size_invariance"].strategy)
def test_chunk_sizes_16_32_64_agree(gdn_target, case):
    check_property("chunk_size_invariance", gdn_target, case)


@examples(SUITE["split_invariance"].weight)
@given(case=SUITE["split_invariance"].strategy)
def test_split_run_with_carried_state_equals_one_pass(gdn_target, case):
    check_property("split_invariance", gdn_target, case)


@examples(SUITE["causality"].weight)
@given(case=SUITE["causality"].strategy)
def test_appending_tokens_never_changes_earlier_outputs(gdn_target, case):
    check_property("causality", gdn_target, case)


@examples(SUITE["batch_independence"].weight)
@given(case=SUITE["batch_independence"].strategy)
def test_batch_rows_are_independent(gdn_target, case):
    check_property("batch_independence", gdn_target, case)


@examples(SUITE["gva_equals_explicit_repeat"].weight)
@given(case=SUITE["gva_equals_explicit_repeat"].strategy)
def test_gva_equals_explicit_repeat_of_key_heads(gdn_target, case):
    check_property("gva_equals_explicit_repeat", gdn_target, case)


@examples(SUITE["determinism"].weight)
@given(case=SUITE["determinism"].strategy)
def test_two_runs_are_bitwise_identical(gdn_target, case):
    check_property("determinism", gdn_target, case)


@examples(SUITE["unstable_no_spurious_nan"].weight)
@given(case=SUITE["unstable_no_spurious_nan"].strategy)
def test_unstable_recurrence_has_no_nan_where_oracle_is_finite(gdn_target, case):
    check_property("unstable_no_spurious_nan", gdn_target, case)
