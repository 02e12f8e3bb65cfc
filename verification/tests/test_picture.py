"""The picture of a run (verification/engine/picture.py): a row per
property with its verdict, a column per tensor in contract order, each cell
its worst ratio, coloured from far inside (green) to the bound (orange) and
beyond it (red); not-checkable tensors and properties grey, declared
tolerances marked."""

import xml.etree.ElementTree as ET

from ..engine import picture


def row(name, rel, bound=1e-6, passed=True):
    return {"name": name, "rel_l2": rel * bound, "max_abs": 0.0, "bound_rel": bound,
            "bound_abs": 1.0, "passed": passed, "note": "", "deviation": 0.0, "tolerated": 0.0}


def structural(name):
    return {"name": name, "rel_l2": 0.0, "max_abs": 0.0, "bound_rel": 0.0, "bound_abs": 0.0,
            "passed": True, "note": "", "deviation": 0.0, "tolerated": 0.0}


REPORT = {"target": "my_kernels", "profile": "dev", "properties": {
    "mixer_gradient_parity": {"verdict": "held", "worst": [
        row("o", 0.03), row("dx", 0.2), row("dx (split 1+14 vs one call)", 0.4),
        structural("dx shape/dtype")], "tolerated": {"dconv_weight": {"worst": 1.5}},
        "tensors_not_checkable": {"dstate.conv": "ignores the incoming conv state"}},
    "delta_rule_gradient_parity": {"verdict": "FAILED", "worst": [
        row("dq", 7.0, passed=False), row("o", 0.001)]},
    "sharded_mixer_equals_one_device": {"verdict": "not checkable", "worst": [],
                                        "reasons": {"needs a mesh": 4}},
}}


def cell_fills(svg_text):
    root = ET.fromstring(svg_text)
    return [r.get("fill") for r in root.iter("{http://www.w3.org/2000/svg}rect")]


def test_cells_are_the_worst_ratio_per_tensor_with_marks():
    cells = picture.cells(REPORT["properties"]["mixer_gradient_parity"])
    assert abs(cells["dx"]["ratio"] - 0.4) < 1e-9          # the worst of its rows
    assert cells["dstate.conv"]["mark"] == "n/c" and cells["dconv_weight"]["mark"] == "T"
    assert cells[picture.STRUCTURAL]["ratio"] == 0.0
    assert picture.columns(REPORT) == ["o", "dq", "dx", "dconv_weight", "dstate.conv",
                                       picture.STRUCTURAL]


def test_colours_run_from_green_to_orange_and_red_beyond_the_bound():
    greens = [int(picture.colour(r)[3:5], 16) for r in (1e-4, 1e-2, 0.1, 0.5, 1.0)]
    assert greens == sorted(greens, reverse=True) and greens[0] > greens[-1]
    assert picture.colour(1.0001) == picture.FAILED_FILL != picture.colour(1.0)


def test_the_picture_has_every_property_its_verdict_and_the_marks():
    svg = picture.svg(REPORT)
    fills = cell_fills(svg)                                  # parses as SVG
    for name in REPORT["properties"]:
        assert name in svg
    assert "delta_rule_gradient_parity  FAILED" in svg and "not checkable: needs a mesh" in svg
    assert fills.count(picture.FAILED_FILL) >= 2             # the dq cell and the legend
    assert picture.NOT_CHECKABLE_FILL in fills and ">n/c<" in svg
    assert ">0.40<" in svg and ">0 T<" in svg


MUTATION_REPORT = {"mutants": [
    {"mutant": "l2norm_bwd_eps_1e12", "impl": "pallas", "killed": True, "status": "killed",
     "killed_by": "near_zero_rows_vjp_parity", "examples_to_kill": 1,
     "kills": {"near_zero_rows_vjp_parity": 1, "mixer_gradient_parity": 4}, "held": []},
    {"mutant": "param_grad_axis_01", "impl": "xla", "killed": True, "status": "killed",
     "killed_by": "mixer_gradient_parity", "examples_to_kill": 2,
     "kills": {"mixer_gradient_parity": 2}, "held": ["param_gradient_is_broadcast_sum"]},
    {"mutant": "old_report_row", "impl": "xla", "killed": True, "status": "killed",
     "killed_by": "causality", "examples_to_kill": 3},
    {"mutant": "survivor", "impl": "xla", "killed": False, "status": "survived",
     "killed_by": None, "examples_to_kill": None, "kills": {}, "held": ["causality"]},
]}


def test_the_kill_matrix_shows_every_killer_its_examples_and_survivors():
    svg = picture.kill_matrix(MUTATION_REPORT)
    fills = cell_fills(svg)
    assert "3 of 4 killed" in svg and ">SURVIVED<" in svg
    # mixer_gradient_parity killed two mutants: the first column
    headers = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")
               if t.get("transform")]
    assert headers[0] == "mixer_gradient_parity"
    assert set(headers) == {"mixer_gradient_parity", "near_zero_rows_vjp_parity",
                            "param_gradient_is_broadcast_sum", "causality"}
    # four kills (one from a report that recorded only its first killer),
    # plus the legend's; two cells ran and held, plus the legend's
    assert fills.count(picture.KILL_FILL) == 5 and fills.count(picture.HELD_FILL) == 3
    assert ">4<" in svg and ">2<" in svg


def test_failures_lead_not_checkables_fold_and_causes_are_listed():
    """FAILED rows first; the not-checkable properties one grey row per
    reason, naming them; each failed property's causes under the grid."""
    scale = {"cause": "passes with the default scale (one change each)",
             "passes_with": ["the default scale"]}
    report = {"target": "t", "profile": "dev", "properties": {
        "mixer_gradient_parity": {"verdict": "held", "worst": [row("dx", 0.2)]},
        "sharded_a": {"verdict": "not checkable", "worst": [], "reasons": {"no mesh": 1}},
        "packed_b": {"verdict": "not checkable", "worst": [], "reasons": {"no packing": 1}},
        "sharded_c": {"verdict": "not checkable", "worst": [], "reasons": {"no mesh": 1}},
        "delta_rule_forward_parity": {"verdict": "FAILED", "worst": [row("o", 9.0, passed=False)],
                                      "classes": {"o float32 finite": {"worst": 9.0,
                                                                       "diagnosis": scale},
                                                  "o bfloat16 finite": {"worst": 3.0,
                                                                        "diagnosis": scale}}}}}
    names = [name for name, _ in picture._rows(report["properties"])]
    assert names == ["delta_rule_forward_parity", "mixer_gradient_parity",
                     "2 not checkable", "1 not checkable"]
    svg = picture.svg(report)
    ET.fromstring(svg)
    assert "not checkable: no mesh (sharded_a, sharded_c)" in svg
    (line,) = picture.cause_lines(report["properties"])
    assert line.startswith("delta_rule_forward_parity: passes with the default scale")
    assert "2 failure class(es)" in line and line in svg
