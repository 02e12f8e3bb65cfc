"""The review's layer kernel, verified as it is (docs/kernel-authors.md "A
layer kernel as it is"): verification/fixture_kernels/author_fixture/review_layer.py (a
layer-only custom VJP with a Pallas backward in interpret mode, written
without gdn_kernels) copied into a directory outside this repository,
declared there by the doc's own block (at most 15 lines, its limits
included), run at the dev profile by the installed `gdn-verify`. Correct,
every checkable property holds and the claims its limits rule out are
listed; with each of the review's two bugs planted back into its text, the
property named for the bug's kind kills it with a counterexample that
`gdn-verify replay` reproduces (and that passes once the bug is gone).
"""

import os
import re
import shutil

import pytest

from ..plugin import long_running
from .test_kernel_author import ROOT, _summary, installed_author

LAYER = os.path.join(ROOT, "verification", "fixture_kernels", "author_fixture", "review_layer.py")
DOC = os.path.join(ROOT, "docs", "kernel-authors.md")
MARKERS = ("<!-- review-layer-declaration -->", "<!-- /review-layer-declaration -->")
MAX_DECLARATION_LINES = 15

# The review's bugs, as text edits of the layer's file, and the property
# that names each one's kind, with the failure class it must report.
PLANTED = {
    "qk_norm_backward_eps": (("QK_NORM_BWD_EPS = 1e-6", "QK_NORM_BWD_EPS = 1e-12"),
                             "near_zero_rows_vjp_parity", "dx float32 finite"),
    "param_gradient_summed_over_0_1": (
        ("return jnp.sum(full, axis=(0, 1)).reshape(p.shape)",
         "return jnp.sum(full, axis=(0, 1))"),
        "cotangent_shapes_and_dtypes", "raised ValueError"),
}


def declaration() -> str:
    """The doc's declaration block (python), as the author saves it."""
    with open(DOC) as f:
        block = f.read().split(MARKERS[0], 1)[1].split(MARKERS[1], 1)[0]
    return block.split("```python", 1)[1].split("```", 1)[0].lstrip("\n")


def _reviewer(home, tmp_path_factory, edit=None):
    """An author directory outside the repository holding the layer (with
    `edit` applied to its text) and the doc's declaration, and the shared
    installed environment. The real dev profile: no example override."""
    assert not str(home).startswith(ROOT)
    with open(LAYER) as f:
        source = f.read()
    if edit is not None:
        assert source.count(edit[0]) == 1, edit[0]
        source = source.replace(*edit)
    (home / "review_layer.py").write_text(source)
    (home / "my_layer.py").write_text(declaration())
    author = installed_author(home, tmp_path_factory)
    author.env.pop("GDN_EXAMPLES", None)
    return author


def test_the_declaration_fits_in_fifteen_lines():
    lines = declaration().rstrip("\n").splitlines()
    assert len(lines) <= MAX_DECLARATION_LINES, "\n".join(lines)
    assert "limits=Limits(" in declaration()
    with open(LAYER) as f:
        imports = [l for l in f if l.startswith(("import ", "from "))]
    assert not any("gdn_kernels" in l or "verification" in l for l in imports), imports


@long_running
def test_the_correct_layer_holds_every_checkable_property(tmp_path_factory):
    author = _reviewer(tmp_path_factory.mktemp("review-layer"), tmp_path_factory)
    run = author.run("gdn-verify --target my_layer")
    out = run.output
    assert run.returncode == 0, out[-4000:]
    summary = _summary(out)
    assert "target my_layer (profile dev, scope properties)" in summary
    assert "FAILED: 0" in summary and "raised" not in summary.split("held on the target")[1]
    held = int(re.search(r"held on the target: (\d+) properties", summary).group(1))
    assert held >= 9, summary[-3000:]
    for prop in ("mixer_gradient_parity", "near_zero_rows_vjp_parity",
                 "cotangent_shapes_and_dtypes", "state_gradient_parity",
                 "vjp_matches_finite_differences"):
        assert re.search(rf"^{prop}\s+held", summary, re.M), summary[-3000:]
    # its returned state checked, the conv history it ignores declared: that
    # history's gradient listed as a tensor not checkable, a call after a
    # conv history not checkable
    assert re.search(r"tensor not checkable: dstate\.conv: the target ignores the incoming "
                     r"conv state", summary), summary[-3000:]
    assert re.search(r"^mixer_split_invariance\s+not checkable .*ignores the incoming conv "
                     r"state", summary, re.M), summary[-3000:]
    # the layer-only target's core op and the limits' claims: said, never passed
    assert "the target exposes no core op (gated_delta_rule): a layer-only target" in summary
    assert re.search(r"claim not met: T=1: ruled out by the target's declared limits", summary)
    assert "held at the declared tolerance" not in summary


@long_running
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_review_bug_is_killed_by_its_property(bug, tmp_path_factory):
    edit, prop, failure_class = PLANTED[bug]
    author = _reviewer(tmp_path_factory.mktemp(f"review-layer-{bug}"), tmp_path_factory, edit)
    run = author.run(f"gdn-verify --target my_layer --properties {prop}")
    out = run.output
    assert run.returncode == 1, out[-4000:]
    assert re.search(rf"FAILED: 1 \({prop}\)", out), out[-4000:]
    line = re.search(rf"failure class {re.escape(failure_class)}: .*counterexample "
                     r"(counterexamples/\S+\.json)", out)
    assert line, out[-4000:]
    again = author.run(f"gdn-verify replay {line.group(1)}")
    assert again.returncode == 1 and "STILL FAILS" in again.output, again.output[-3000:]
    # the bug taken out again: the same counterexample passes
    shutil.copy(LAYER, os.path.join(author.home, "review_layer.py"))
    fixed = author.run(f"gdn-verify replay {line.group(1)}")
    assert fixed.returncode == 0 and "all pass" in fixed.output, fixed.output[-3000:]
