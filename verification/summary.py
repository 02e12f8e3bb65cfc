"""The run's text: one progress line per finished property, and the
summary (the table of properties, each failure class and each claim not
met, the deviation and declared-tolerance tables, the projected wall, and
the verdict lines that say what held on the target). Read from a run's
record (plugin.SuiteRun: its target, profile, scope, statistics, compile
counts and clock); written to the terminal by the plugin's Summary hooks.
"""

from __future__ import annotations

import os
import time


def shape_budget_line() -> str:
    """The loaded profile's covering of the shape lattice: its compile budget."""
    from strategies import lattice
    kind = lattice.current_covering()
    beyond = lattice.declared_beyond_contract()
    within = (beyond, lattice.declared_limits(), lattice.declared_knob_values())
    mixer, delta = lattice.mixer_geometries(*within), lattice.delta_geometries(*within)
    counts = [len(lattice.covering(rows, tuple(knobs), kind)) for rows, knobs in
              ((mixer, lattice.MIXER_KNOBS), (delta, lattice.DELTA_KNOBS))]
    return (f"shapes: the lattice's {kind} covering, {counts[0]} mixer and {counts[1]} "
            f"delta-rule geometries (of {len(mixer)} and {len(delta)})"
            + (f"; chunk sizes beyond the contract, declared: {list(beyond)}" if beyond else ""))


# ---------------------------------------------------------------- the report
def _worst_text(row) -> str:
    """The worst row as the verdict judged it: relative and absolute error,
    or the absolute error alone for a row judged by the near-zero floor."""
    if not row.bound_rel and not row.bound_abs:
        return "all exact/structural checks"
    if row.near_zero:
        measure = f"abs {row.max_abs:.2e} / {row.bound_abs:.1e} (near-zero)"
    else:
        measure = f"rel {row.rel_l2:.2e} / {row.bound_rel:.1e}"
    return f"{row.name}: {measure}, ratio {row.ratio:.2f}"


def _worst_row(st):
    """The worst row of a property's statistics (PropertyStats or its JSON)."""
    from .tolerance import TensorError
    rows = ([TensorError(**r) for r in st["worst"]] if isinstance(st, dict)
            else list(st.worst.values()))
    return max(rows, key=lambda r: r.ratio, default=None)


def progress_line(name: str, st: dict) -> str:
    """One line per finished property: verdict, examples, worst ratio, time."""
    worst = _worst_row(st)
    ratio = f", worst ratio {worst.ratio:.2f} ({worst.name})" if worst and worst.bound_rel else ""
    nc = f", {st['not_checkable']} not checkable" if st["not_checkable"] else ""
    raised = f", {st['raised']} raised" if st.get("raised") else ""
    checked = st["examples"] - st.get("unresolved", 0) - st.get("raised", 0)
    return (f"{name}: {st['verdict'] or '?'}: {checked} example(s) checked{raised}{nc}{ratio} "
            f"[{st['seconds']:.0f} s]")


def summary_lines(suite) -> list:
    from .engine import harness
    from .engine.shards import projection_line
    lines = []
    head = (f"{'property':<42}{'verdict':>14}{'examples':>9}{'n/c':>5}{'fail':>5}"
            f"{'claims':>8}{'compiles':>9}{'ex/comp':>8}{'time s':>8}  worst tensor (error/bound)")
    lines.append(head)
    lines.append("-" * (len(head) + 10))
    for name in sorted(suite.session.stats):
        st = suite.session.stats[name]
        worst = _worst_row(st)
        w = _worst_text(worst) if worst else "-"
        if st.reasons:
            w += f"; not checkable: {harness.reasons_text(st)}"
        label = suite.target.declaration.mixer_label
        if label and st.mixer_examples:
            w = f"[{label}] {w}"
        if st.classes:
            w += f"; counterexample {_class_file(st, st.worst_class)}"
        per = f"{st.examples / st.compiles:.1f}" if st.compiles else "-"
        met, unmet = claim_status(name, st)
        lines.append(f"{name:<42}{st.verdict or '-':>14}{st.examples:>9}{st.not_checkable:>5}"
                     f"{st.failures:>5}{f'{len(met)}/{len(met) + len(unmet)}':>8}"
                     f"{st.compiles:>9}{per:>8}{st.seconds:>8.1f}  {w}")
        lines += failure_class_lines(st)
        if st.checked:      # a property not checkable at all says why in its row
            lines += [f"    claim not met: {claim}: {why}" for claim, why in unmet.items()]
            lines += [f"    tensor not checkable: {tensor}: {why}"
                      for tensor, why in sorted(st.tensors_not_checkable.items())]
    lines += deviation_lines(suite.target.declaration, suite.session.stats)
    lines += tolerance_lines(suite.target.declaration, suite.session.stats)
    lines.append(projection_line(list(suite.test_seconds.values()), "test-session"))
    lines += verdict_lines(suite, suite.session.stats)
    return lines


def claim_status(name: str, st) -> tuple:
    """(claims the property's checked examples met, {claim not met: why})
    for the loaded profile's claims (verification/engine/claims.py)."""
    from strategies import lattice
    from .engine.claims import claims_of
    from .properties import load_all
    p = load_all().get(name)
    if p is None:
        return [], {}
    claims = claims_of(p, lattice.current_covering())
    met = sorted(c for c in claims if st.claims_met.get(c))
    unmet = {c: st.claims_unmet.get(c, "no checked example met it") for c in claims
             if c not in met}
    unmet.update({c: why for c, why in st.claims_unmet.items() if c not in claims})
    return met, unmet


def shown_path(path: str) -> str:
    """path relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _class_file(st, klass) -> str:
    return st.classes[klass]["file"] or "(not written)"


def ratio_text(ratio) -> str:
    """A ratio to the bound as the report prints it ("?" where unknown)."""
    return "?" if ratio is None else f"{ratio:.3g}"


def _class_line(st, k: str, indent: str) -> str:
    c = st.classes[k]
    return (f"{indent}failure class {k}: {c['examples']} failing run(s), shrunk case ratio "
            f"{ratio_text(c.get('shrunk'))} (worst seen {ratio_text(c['worst'])}), "
            f"counterexample {_class_file(st, k)}"
            + (f"; {c['message']}" if c.get("message") else ""))


def failure_class_lines(st) -> list:
    """The failure classes of a property, the worst first, each its own
    counterexample file with the ratio of the shrunk case it holds beside
    the worst seen while searching; classes a diagnosis gives one cause
    (the same changes make each pass) listed under that cause."""
    from .engine.diagnosis import causes
    lines = []
    for key, classes in causes(st.classes).items():
        diagnosis = st.classes[classes[0]].get("diagnosis")
        if diagnosis is None:
            lines += [_class_line(st, k, "    ") for k in classes]
            continue
        lines.append(f"    cause: {diagnosis['cause']}: {len(classes)} failure class(es)")
        lines += [_class_line(st, k, "      ") for k in classes]
    return lines


def deviation_lines(declaration, stats) -> list:
    """The tensors that held only at the target's declared compute precision,
    one row per tensor over every property: how far beyond the contract's
    float32 bound they went, in how many examples, and where."""
    from .tolerance import PRECISIONS
    tensors = _beyond_table(stats, "deviations")
    if not tensors:
        return []
    declared = PRECISIONS[declaration.supports.compute_precision]
    lines = ["", f"deviates from the contract's float32 state and accumulation, within the "
                 f"declared compute precision {declared.name!r} ({declared.model}):",
             f"    {'tensor':<16}{'x contract bound':>18}{'examples':>10}  properties"]
    for tensor in sorted(tensors, key=lambda t: -tensors[t]["worst"]):
        row = tensors[tensor]
        lines.append(f"    {tensor:<16}{row['worst']:>18.3g}{row['examples']:>10}  "
                     f"{', '.join(sorted(row['properties']))}")
    return lines


def factors_text(factors) -> str:
    return ", ".join(f"{tensor} x{factor:g}" for tensor, factor in sorted(factors.items()))


def _beyond_table(stats, field: str) -> dict:
    """tensor -> {"examples", "worst", "properties"} over every property's
    `field` table (deviations, tolerated)."""
    tensors = {}
    for name, st in stats.items():
        for tensor, d in getattr(st, field).items():
            row = tensors.setdefault(tensor, {"examples": 0, "worst": 0.0, "properties": []})
            row["examples"] += d["examples"]
            row["worst"] = max(row["worst"], d["worst"])
            row["properties"].append(name)
    return tensors


def tolerance_lines(declaration, stats) -> list:
    """The tensors that held only at the author's declared tolerance, one
    row per tensor over every property (its factor, how far beyond the
    policy's bound it went, in how many examples, where), and the declared
    tensors no row needed (a misspelt name shows here)."""
    factors = dict(declaration.tolerance)
    if not factors:
        return []
    tensors = _beyond_table(stats, "tolerated")
    lines = ["", f"held at the declared tolerance (the author's factor over the policy's "
                 f"bound; declared: {factors_text(factors)}):"]
    if tensors:
        lines.append(f"    {'tensor':<16}{'factor':>8}{'x policy bound':>16}{'examples':>10}"
                     f"  properties")
    for tensor in sorted(tensors, key=lambda t: -tensors[t]["worst"]):
        row = tensors[tensor]
        lines.append(f"    {tensor:<16}{factors.get(tensor, 0):>8g}{row['worst']:>16.3g}"
                     f"{row['examples']:>10}  {', '.join(sorted(row['properties']))}")
    unused = sorted(set(factors) - set(tensors))
    if unused:
        lines.append(f"    declared, never needed in this run: {', '.join(unused)}")
    return lines


def deviating_tensors(stats) -> list:
    """The tensors with a deviation row in any property, sorted."""
    return sorted({t for st in stats.values() for t in st.deviations})


def verdict_lines(suite, stats) -> list:
    """The summary's last lines: what was verified, on what, said plainly."""
    from .engine import harness
    from .engine.profiles import hypothesis_note
    from .tolerance import CONTRACT_PRECISION
    by = {}
    for name, st in stats.items():
        by.setdefault(st.verdict or "-", []).append(name)
    examples = sum(st.checked for st in stats.values())
    raised = sum(st.raised for st in stats.values())
    compiles = suite.total_compiles()
    lines = [f"target {suite.target.spec} (profile {suite.profile_name()}, scope "
             f"{suite.scope}): {len(stats)} properties, {examples} examples checked, "
             + (f"{raised} raised (not checked), " if raised else "")
             + f"{compiles} programs built ({suite.cache_hits()} read from the compile cache)"
             + (f", {examples / compiles:.2f} examples per program" if compiles else "")
             + f", {time.perf_counter() - suite.start:.0f} s"]
    lines += [f"  adapter: {line}" for line in suite.target.declaration.conventions]
    lines += [f"  {line}" for line in (hypothesis_note(),) if line]
    held = by.get(harness.HELD, [])
    precision = suite.target.declaration.supports.compute_precision
    lines.append(f"  held on the target: {len(held)} properties"
                 + (f" (bfloat16 cases within its declared compute precision {precision!r})"
                    if precision != CONTRACT_PRECISION else ""))
    tolerated = _beyond_table(stats, "tolerated")
    if tolerated:
        lines.append("  held at the declared tolerance (not within the policy's bound): "
                     + ", ".join(f"{t} x{suite.target.declaration.tolerance.get(t, 0):g} "
                                 f"(worst {tolerated[t]['worst']:.3g}x the policy's bound)"
                                 for t in sorted(tolerated)))
    deviating = deviating_tensors(stats)
    if deviating:
        lines.append(f"  deviates from the contract's float32 (not failures): "
                     f"{', '.join(deviating)}")
    status = [claim_status(name, st) for name, st in stats.items() if st.checked]
    met = sum(len(m) for m, _ in status)
    unmet = sum(len(u) for _, u in status)
    lines.append(f"  coverage claims met by the checked examples: {met} of {met + unmet}"
                 + (f" ({unmet} not met: listed under their properties)" if unmet else ""))
    nc = by.get(harness.NOT_CHECKABLE, [])
    partly = sum(st.not_checkable for n, st in stats.items() if n not in nc)
    lines.append(f"  not checkable: {len(nc)} properties"
                 + (f" ({', '.join(sorted(nc))})" if nc else "")
                 + (f"; {partly} further example(s) not checkable" if partly else ""))
    partial = sorted(f"{t} in {n}" for n, st in stats.items() for t in st.tensors_not_checkable)
    if partial:
        lines.append(f"  tensors not checkable (their examples' other tensors were): "
                     f"{', '.join(partial)}: listed under their properties")
    for verdict in (harness.XFAIL, harness.XPASS, harness.FAILED):
        names = by.get(verdict, [])
        if names or verdict == harness.FAILED:
            lines.append(f"  {verdict}: {len(names)}" + (f" ({', '.join(sorted(names))})"
                                                        if names else ""))
    return lines
