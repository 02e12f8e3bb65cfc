"""Meta-tests of the tolerance policy: the ratio a row reports is the one its
verdict used (a passing numeric row never reports a ratio above 1, a failing
one never at or below 1), and the dtype table covers every dtype a case uses."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.inputs import DTYPES as CASE_DTYPES

from .tolerance import DTYPES, compare_self, compare_to_oracle

SCALES = st.sampled_from((0.0, 1e-12, 1e-7, 1e-3, 1.0, 1e3))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(1, 40), scale=SCALES,
       noise=SCALES, ref_noise=SCALES, dtype=st.sampled_from(sorted(DTYPES)))
def test_ratio_agrees_with_verdict(seed, size, scale, noise, ref_noise, dtype):
    rng = np.random.default_rng(seed)
    oracle = scale * rng.standard_normal(size)
    kernel = oracle + noise * rng.standard_normal(size)
    reference = oracle + ref_noise * rng.standard_normal(size)
    for row in (compare_to_oracle("t", kernel, oracle, reference, dtype),
                compare_self("t", kernel, oracle, dtype)):
        if row.passed:
            assert row.ratio <= 1.0, row
        else:
            assert row.ratio > 1.0 or math.isinf(row.ratio), row


def test_every_case_dtype_has_a_tolerance():
    assert set(CASE_DTYPES) == set(DTYPES)
