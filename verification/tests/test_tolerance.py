"""Meta-tests of the tolerance policy: the ratio a row reports is the one its
verdict used (a passing numeric row never reports a ratio above 1, a failing
one never at or below 1), and the dtype table covers every dtype a case uses."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.inputs import DTYPES as CASE_DTYPES

from ..tolerance import DTYPES, TensorError, compare_self, compare_to_oracle, format_table

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


# --- the author's declared tolerance (KernelDeclaration.tolerance) ----------

def _row(name, rel, bound=2e-6, note=""):
    return TensorError(name, rel, rel, bound, bound, rel <= bound, note)


def test_a_declared_tolerance_holds_within_its_factor_and_fails_beyond():
    from ..tolerance import BEYOND_TOLERANCE, NON_FINITE, TOLERATED, at_declared_tolerance
    rows = [_row("da_log", 3e-5), _row("da_log (split 1+15 vs one call)", 1e-4),
            _row("ddt_bias", 3e-5), _row("dx", 1e-6),
            TensorError("da_log", math.inf, math.inf, 2e-6, 2e-6, False, NON_FINITE),
            TensorError("da_log shape", 0.0, 0.0, 0.0, 0.0, False, "wrong shape")]
    held, beyond, other, fine, nan, shape = at_declared_tolerance(rows, {"da_log": 16})
    assert held.passed and held.note == f"{TOLERATED} x16" and held.tolerated == pytest.approx(15)
    assert held.ratio <= 1 and held.bound_rel == 16 * 2e-6
    assert not beyond.passed and beyond.note == f"{BEYOND_TOLERANCE} x16"
    assert beyond.ratio == pytest.approx(50)        # still the policy's ratio
    assert other == rows[2] and fine == rows[3]      # undeclared tensors untouched
    assert nan == rows[4] and shape == rows[5]       # never non-finite, never structural
    assert at_declared_tolerance(rows, {}) == rows
    assert "15x its bound" in format_table([held])


def test_a_declared_tolerance_is_checked_where_declared():
    from verification import KernelDeclaration
    for bad in ({"da log": 16}, {"da_log": 1}, {"da_log": math.nan}, {"da_log": "16"}):
        with pytest.raises(ValueError, match="tolerance"):
            KernelDeclaration(gdn_decoupled_conv1d=lambda *a, **k: None, tolerance=bad)


@pytest.mark.long_running
@pytest.mark.parametrize("module, factor", [("imprecise_a_log_gradient", "10000"),
                                            ("imprecise_a_log_gradient_tight", "2")])
def test_a_declared_tolerance_is_printed_and_fails_beyond_its_factor(module, factor, tmp_path):
    """A layer with a known da_log imprecision (hundreds of times the
    policy's bound): declared x1e4 it holds, the header and summary saying
    so with the policy's ratio; declared x2 the same kernel fails."""
    from .test_declared_targets import _pytest
    proc = _pytest("--gdn-target", f"verification.fixture_kernels.wrong_targets.{module}",
                   "--gdn-properties", "mixer_gradient_parity", "--gdn-examples", "1",
                   env={"GDN_COUNTEREXAMPLES": str(tmp_path)})
    out = proc.stdout
    assert f"over the policy's bound; declared: da_log x{factor})" in out, out[-3000:]
    if factor == "2":
        assert proc.returncode == 1 and "beyond the declared tolerance x2" in out, out[-3000:]
        return
    assert proc.returncode == 0, out[-3000:]
    (row,) = [line for line in out.splitlines() if line.startswith("    da_log ")]
    assert float(row.split()[2]) > 10, row                    # x the policy's bound
    assert "held at the declared tolerance (not within the policy's bound): da_log x10000" in out
