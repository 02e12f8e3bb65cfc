"""Coverage claims met by construction, in every run.

A property's coverage claims (registry.Property.covers, and in the gate's
profiles gate_covers) name the edge classes its cases exercise. Drawing
alone only makes a claim reachable: a profile that runs a property on two
drawn examples checks at most two of its split kinds, which ones by the luck
of the seed. So every run of a property starts with its CLAIM CASES: the
fewest cases (greedy set cover, then pruned so that each one is the only
case meeting some claim) that meet every claim its explicit examples do not
already meet, found deterministically (derandomized draws of the property's
own strategy, under the loaded profile's lattice covering, of cases the
target takes), the cheapest shape first; then the drawn examples.

A claim no such case meets is reported unmet with its reason (gate-only in
this profile; the target does not take the cases that meet it; not found in
CANDIDATE_DRAWS draws), in the run's header of that property and in the
summary, never dropped silently. Where the claim declares what every case
meeting it asks (registry.claim: packed rows, GVA, bfloat16, no QK norm...)
and the target's declaration lacks it, that is known without a search:
such claims had cost a restricted target's plans all CANDIDATE_DRAWS draws
each (a layer fixture's dev plans: 100 s, now 10 s). Likewise a claim met
by a case's shape alone (registry.shape_claim: T=1, C=128, a [B, Hv]
a_log...) that no shape of the property's lattice meets (the rows its
strategy draws on, inside the target's declared limits and supports: whole
chunks rule out T=1) is unmet without a search. What the run's cases
met is measured on the cases the target checked (harness.check_property) and
shown per property.

A plan is kept in this process and across runs (the plan store, below:
beside the program store in the compile cache, keyed by the suite's own
source and what the plan reads of the target), so a warm run draws no
candidates.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
from typing import Callable, Dict, Mapping, Optional, Tuple

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from strategies import lattice
from strategies.cases import case_from_json, case_to_json

from . import program_store
from .registry import met_by_shape
from ..targets import Target

# The most draws of a property's strategy searched for its claim cases (the
# reachability budget the meta-tests have always used), and the fewest
# cases the target takes drawn before the cheapest are chosen among them.
CANDIDATE_DRAWS = 2000
CANDIDATE_POOL = 64

GATE_ONLY = ("gate-only: the dev profile's lattice covering leaves out the rows that meet it "
             "(met in the ci, kill and nightly profiles)")


@dataclasses.dataclass(frozen=True)
class ClaimPlan:
    """How one run of a property meets its claims.

    claims: the claims this profile holds it to (name -> predicate)
    cases:  its claim cases, run after the explicit examples
    unmet:  claim -> why no case of the run is built to meet it
    """
    claims: Mapping[str, Callable]
    cases: Tuple = ()
    unmet: Mapping[str, str] = dataclasses.field(default_factory=dict)


def claims_of(p, covering: str) -> Dict[str, Callable]:
    """The claims a run of p in a profile of this lattice covering is held
    to: its covers, and in the "pairs" covering (the gate's) its gate_covers."""
    return dict(p.covers, **(p.gate_covers if covering == "pairs" else {}))


def claims_met(claims: Mapping[str, Callable], case) -> frozenset:
    """The claims this case meets."""
    return frozenset(name for name, predicate in claims.items() if predicate(case))


def unmet_by(claims: Mapping[str, Callable], cases) -> frozenset:
    """The claims none of these cases meets."""
    return frozenset(claims) - frozenset().union(*(claims_met(claims, c) for c in cases))


# Elements (tokens x channels) that cost about one more program's compile:
# a case's cost is one program plus its size in these units, so a large
# case is picked only where it meets claims that several small ones would.
ELEMENTS_PER_PROGRAM = 4096


def case_cost(case) -> float:
    """What a case costs to run, roughly: one program, plus its size (the
    oracle's token scan and the compile grow with its length)."""
    elements = case.batch * case.seq_len * case.v_heads * (case.dk + case.dv)
    return 1.0 + elements / ELEMENTS_PER_PROGRAM


def cover(candidates, wanted: frozenset) -> Tuple:
    """The cheapest few (greedy) of `candidates` ((case, claims it meets)
    pairs, in draw order) meeting every claim of `wanted` that any of them
    meets: each step the most new claims per unit of case_cost (the first
    drawn among equals); then pruned, the last picked first, so that every
    case kept is the only one meeting some claim."""
    uncovered, picked = set(wanted), []
    while uncovered:
        best = max(range(len(candidates)),
                   key=lambda j: (len(candidates[j][1] & uncovered) / case_cost(candidates[j][0]),
                                  -j),
                   default=None)
        if best is None or not candidates[best][1] & uncovered:
            break
        picked.append(candidates[best])
        uncovered -= candidates[best][1]
    for entry in reversed(list(picked)):
        rest = [e for e in picked if e is not entry]
        if entry[1] & wanted <= frozenset().union(*(e[1] for e in rest)):
            picked = rest
    return tuple(case for case, _ in picked)


def _draw_candidates(p, claims: Mapping[str, Callable], wanted: frozenset,
                     takes: Callable) -> Tuple[list, Dict[str, str]]:
    """Derandomized draws of p's strategy: the candidates the target takes
    ((case, claims met) in draw order, duplicates dropped), and for a claim
    met only by cases the target does not take, the first such reason."""
    candidates, seen, refused, reached = [], set(), {}, set()
    quick = settings(max_examples=CANDIDATE_DRAWS, database=None, derandomize=True,
                     deadline=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))

    def enough(case) -> bool:
        met = claims_met(claims, case) & wanted
        reason = takes(case)
        if reason:
            for name in met:
                refused.setdefault(name, reason)
            return False
        if case not in seen:
            seen.add(case)
            candidates.append((case, met))
            reached.update(met)
        return reached >= wanted and len(candidates) >= CANDIDATE_POOL

    try:
        find(p.strategy, enough, settings=quick)
    except (NoSuchExample, Unsatisfiable):
        pass                      # every draw searched: what was reached is kept
    return candidates, refused


def plan(p, target=None) -> ClaimPlan:
    """The claim plan of property p in the loaded profile, for `target`
    (None: every case is taken). Kept per property, covering, declared
    chunk sizes, declared limits and knob values, and what the plan reads of the target
    (target_fingerprint: mutants of one kernel, or one kernel under several
    specs, share a plan), in this process and across runs (the plan store
    below)."""
    key = (p.id, lattice.current_covering(), lattice.declared_beyond_contract(),
           lattice.declared_limits(), lattice.declared_knob_values(),
           target_fingerprint(target))
    if key not in _PLANS:
        where = _plan_path(key)
        kept = _kept_plan(p, key, where)
        _PLANS[key] = kept or _plan(p, key[1], target)
        if kept is None:
            _keep_plan(where, _PLANS[key])
    return _PLANS[key]


_PLANS: Dict[tuple, ClaimPlan] = {}


def target_fingerprint(target) -> Optional[tuple]:
    """All a plan reads of its target: Property.not_checkable(target, case)
    reads the declaration alone (targets.declaration.unmet: its supports and
    which functions it declares; Limits.refuses_case: its limits). Every
    field of the declaration, a function as only "declared"."""
    if target is None:
        return None
    if type(target) is not Target:          # a stand-in with rules of its own: itself
        return ("object", id(target))
    declaration = target.declaration
    return tuple((f.name, "<declared>" if callable(getattr(declaration, f.name))
                  else repr(getattr(declaration, f.name)))
                 for f in dataclasses.fields(declaration))


# -------------------------------------------------------------- the plan store
# A plan costs its property's strategy's draws (up to CANDIDATE_DRAWS; 0.1 to
# 2.6 s each, 12 s of CPU for the 33 properties on this 2-core machine): a
# warm run reads it instead, from <compile cache>/gdn-claim-plans, on, off
# and read-only with the program store (verification/engine/program_store.py).
# Its key: the plan's key above, and everything the draws and the claims
# read: the source of the suite's strategies and properties (every .py file
# of the strategies and verification packages, its tests left out), the
# Hypothesis release and the Python version. A plan read back is the plan
# computed; what the run's cases met is still measured on the cases run.
PLAN_SUBDIR = "gdn-claim-plans"
PLAN_FORMAT = "gdn-claim-plan/1"


@functools.lru_cache(maxsize=None)
def _suite_digest() -> str:
    """SHA-256 of the suite's strategies and properties (every .py file of
    the strategies and verification packages but the tests), the Hypothesis
    release and the Python version."""
    import hypothesis
    import strategies
    import verification
    digest = hashlib.sha256(f"{PLAN_FORMAT} {hypothesis.__version__} {sys.version_info[:2]}".encode())
    for package in (strategies, verification):
        root = os.path.dirname(os.path.abspath(package.__file__))
        for folder, dirs, files in sorted(os.walk(root)):
            dirs[:] = sorted(d for d in dirs if d not in ("tests", "__pycache__"))
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def _plan_path(key: tuple) -> Optional[Tuple[str, bool]]:
    """(the plan's file, writable), or None with the store off."""
    where = program_store.directory(PLAN_SUBDIR)
    if where is None or (key[-1] and key[-1][0] == "object"):
        return None
    name = hashlib.sha256(f"{_suite_digest()} {key!r}".encode()).hexdigest()
    return os.path.join(where[0], name + ".json"), where[1]


def _kept_plan(p, key: tuple, where: Optional[Tuple[str, bool]]) -> Optional[ClaimPlan]:
    """The plan stored under key (at where, _plan_path's), or None (none,
    or the store off)."""
    if where is None:
        return None
    try:
        with open(where[0]) as f:
            data = json.load(f)
        return ClaimPlan(claims_of(p, key[1]), tuple(case_from_json(c) for c in data["cases"]),
                         dict(data["unmet"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None                          # none yet, or unreadable: planned anew


def _keep_plan(where: Optional[Tuple[str, bool]], kept: ClaimPlan) -> None:
    """Store the plan at where (_plan_path's) when the store is writable."""
    if where is None or not where[1]:
        return
    program_store.write_whole(where[0], json.dumps(
        {"cases": [case_to_json(c) for c in kept.cases], "unmet": dict(kept.unmet)}).encode())


def _plan(p, covering: str, target) -> ClaimPlan:
    claims = claims_of(p, covering)
    unmet = ({name: p.gate_only_why or GATE_ONLY for name in p.gate_covers}
             if covering != "pairs" else {})

    def takes(case) -> Optional[str]:
        return None if target is None else p.not_checkable(target, case)

    by_examples = frozenset().union(*(claims_met(claims, c) for c in p.examples
                                      if not takes(c)))
    wanted = frozenset(claims) - by_examples
    shapes = _shapes(p)
    for name in sorted(wanted):
        declined = None if target is None else p.claim_not_checkable(target, claims[name])
        if declined:
            unmet[name] = f"the target does not take the cases that meet it ({declined})"
        elif shapes is not None and met_by_shape(claims[name]) and not any(
                claims[name](shape) for shape in shapes):
            unmet[name] = _ruled_out("no shape of the property's lattice", "meets it")
    wanted -= frozenset(unmet)
    if not wanted:
        return ClaimPlan(claims, (), unmet)
    candidates, refused = _draw_candidates(p, claims, wanted, takes)
    cases = cover(candidates, wanted)
    reached = frozenset().union(*(claims_met(claims, c) for c in cases))
    for name in sorted(wanted - reached):
        if name in refused:
            unmet[name] = f"the target does not take the cases that meet it ({refused[name]})"
        else:
            unmet[name] = _ruled_out("no case", f"meets it in {CANDIDATE_DRAWS} draws of the "
                                                f"property's strategy")
    return ClaimPlan(claims, cases, unmet)


def _shapes(p) -> Optional[list]:
    """The shapes (strategies.cases.shape_case) p's strategy draws its cases
    on, from the lattice built inside the target's declared limits and
    supports, or None where the strategy cannot say (strategies.composite.
    yields). Not filtered by what the target takes of a case: that may
    depend on fields drawn apart from the shape (a QK-norm eps), which a
    shape leaves at its default."""
    shape_cases = getattr(p.strategy, "shape_cases", None)
    return None if shape_cases is None else shape_cases()


def _ruled_out(what: str, meets: str) -> str:
    """Why a claim is unmet when `what` (within the target's declared limits
    or supports, where it declares any) `meets` it."""
    declared = " or ".join(name for name, on in (
        ("limits", lattice.declared_limits() is not None),
        ("supports", bool(lattice.declared_knob_values()))) if on)
    if declared:
        return f"ruled out by the target's declared {declared}: {what} within them {meets}"
    return f"{what} {meets}"
