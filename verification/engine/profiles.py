"""Hypothesis profiles of the suite.

dev      default: about a minute on two cores (a rerun less); the local
         example database (.hypothesis/) is on, plus a shared read-only
         database when one is configured, so a failure found before replays
         first. Its shapes come from the lattice's values covering (every
         knob value in 8-10 rows: strategies.lattice.PROFILE_COVERING), the
         other profiles' from every row. No explain phase: after a failure
         it reruns the property on variations of the shrunk case (each a
         new compile, up to 10 s on a fixture kernel) to name choice-sequence
         spans; the counterexample file and its error table say more.
ci       derandomized, more examples, print_blob=True, no database:
         the same examples on every run of the same code, in .ci/run, in
         the GitHub workflow and in the reusable gate alike (GDN_HYPOTHESIS_DB
         does not change it; a failure is kept as a counterexample file).
nightly  many examples, random seeds, target()-guided search for the
         largest error / bound ratio.
repro    replays only the stored examples (explicit @example rows and the
         example database); generates nothing.
kill     the mutation runner's: ci's examples, derandomized, no database,
         and no shrinking. A mutant's run stops at its first failing example
         (examples to kill is counted there); shrinking that failure would
         only rerun the broken kernel on smaller cases, each a new compile.
Selected by --hypothesis-profile NAME or the GDN_PROFILE environment variable;
where neither names one, ci where the CI environment variable is set (as
Hypothesis itself loads its "ci" profile there), else dev. Hypothesis's
pytest options that change a loaded profile (--hypothesis-verbosity,
--hypothesis-explain) load a copy named "<profile>-with-...": the suite
reads the profile it derives from (strategies.lattice.suite_profile).

The draws depend on the profile, the property, the target's declaration and
the Hypothesis version (pinned in pyproject.toml), never on the process that
makes them. Hypothesis's generator, one draw in twenty, returns a constant
found in the source of a "local" module loaded in the process (any module
not in site-packages or the standard library, and whose path has no "test"
part): which ones are loaded grows with the process's history (the previous
mutants' packages in a reused worker, modules a test imported lazily, the
tests an xdist worker ran before, the entry point), and every literal of the
project's code is in it. The same derandomized profile then drew other
examples in a reused mutation worker than in a fresh process (issue 40:
mutant no_decay_between_chunks killed at example 28 instead of 26), and other
examples after any edit that added a number anywhere in the code. The
suite's strategies draw from a lattice and a seed, where a constant of our
own code is no better a value than any other: `freeze_local_constants`
keeps that pool empty in every process that registers these profiles
(Hypothesis's own table of constants, fixed by its version, still applies).
"""

from __future__ import annotations

import os
from typing import Optional


ENV_VAR = "GDN_PROFILE"
DEFAULT = "dev"
PROFILES = ("dev", "ci", "nightly", "repro", "kill")

# Examples per property in each profile (scaled per property by `weight`).
# ci: 40 (about 1,050 property examples in all). The gate is compile-bound
# (a new shape costs 1-5 s to compile, its run milliseconds), and its power
# is measured by the mutation run at 30 examples (median examples to kill:
# 3); at 60 the suite took 56 of the gate's 110 minutes on this machine.
EXAMPLES = {"dev": 8, "ci": int(os.environ.get("GDN_CI_EXAMPLES", "40")),
            "nightly": 400, "repro": 0}
EXAMPLES["kill"] = EXAMPLES["ci"]
# The profiles whose example budget per property counts its claim cases
# (verification/engine/claims.py: they are drawn from its strategy too, only
# chosen), the drawn examples filling the rest: the dev loop's, whose time is
# the budget (claim cases on top of its draws took the main job from 137 to
# 174 s cold on a 2-core EPYC). The gate's profiles draw what they drew
# before claim cases existed, the claim cases on top: their power and the
# mutation run's examples to kill stay as measured.
CLAIM_CASES_IN_BUDGET = ("dev",)

# filter_too_much: a case the target does not declare support for is
# rejected (verification/engine/harness.py), which may be most of a strategy's cases.
def _suppressed():
    from hypothesis import HealthCheck
    return [HealthCheck.too_slow, HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much]


def local_database_dir() -> str:
    return os.environ.get("GDN_HYPOTHESIS_DB", ".hypothesis/examples")


def dev_database():
    """The local database, multiplexed with a shared read-only database when
    available (see verification.engine.shared_db)."""
    from .shared_db import database_for_dev
    from hypothesis.database import DirectoryBasedExampleDatabase
    return database_for_dev(DirectoryBasedExampleDatabase(local_database_dir()))


def freeze_local_constants() -> None:
    """Keep Hypothesis's pool of constants read from the process's local
    modules empty from now on (see the module's docstring: the pool made
    derandomized draws depend on the process's history). The pool is a
    module global that Hypothesis extends by union (`pool | new`) whenever
    the process has loaded new modules: it is replaced by an empty pool
    whose union is itself, and the cache of constants already admitted per
    draw kind is cleared. Idempotent; raises RuntimeError naming what is
    missing if this Hypothesis keeps its pool elsewhere (both ends of
    pyproject.toml's range are run by verification/tests/test_hypothesis_range.py)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
        providers._local_constants, providers.CONSTANTS_CACHE.cache   # noqa: B018
    except (ImportError, AttributeError) as err:
        import hypothesis
        raise RuntimeError(
            f"gdn-verify cannot keep Hypothesis {hypothesis.__version__}'s local-constant "
            f"pool empty ({err}); its derandomized draws would depend on the process's "
            f"history: install a Hypothesis of the range pyproject.toml allows (the gate's "
            f"is {GATE_HYPOTHESIS}, constraints.txt)") from None
    if not getattr(providers._local_constants, "frozen_empty", False):
        class FrozenEmptyConstants(Constants):
            """No constants, and a union with more is still none."""
            frozen_empty = True

            def __or__(self, other):
                return self

        providers._local_constants = FrozenEmptyConstants()
    providers.CONSTANTS_CACHE.cache.clear()


def register_profiles(examples: Optional[int] = None) -> None:
    """Register the profiles (and keep the draws independent of the
    process: freeze_local_constants); examples (--gdn-examples) replaces every
    profile's examples per property. (Hypothesis is imported here, not with
    the module: `gdn-verify` reads PROFILES before pytest starts, and pytest
    can only rewrite the asserts of plugins it imports itself.)"""
    from hypothesis import Phase, settings
    freeze_local_constants()
    from hypothesis.database import DirectoryBasedExampleDatabase
    _SUPPRESS = _suppressed()
    count = (lambda name: examples) if examples else EXAMPLES.get
    settings.register_profile(
        "dev", max_examples=count("dev"), deadline=None,
        suppress_health_check=_SUPPRESS, database=dev_database(),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    # Derandomized wherever it runs (Hypothesis allows no database with
    # derandomize=True): the scheduled workflow's nightly profile fills the
    # shared database instead.
    settings.register_profile(
        "ci", max_examples=count("ci"), deadline=None, derandomize=True,
        print_blob=True, database=None, suppress_health_check=_SUPPRESS,
        phases=[Phase.explicit, Phase.generate, Phase.shrink])
    settings.register_profile(
        "nightly", max_examples=count("nightly"), deadline=None,
        suppress_health_check=_SUPPRESS, print_blob=True,
        database=DirectoryBasedExampleDatabase(local_database_dir()),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target,
                Phase.shrink, Phase.explain])
    settings.register_profile(
        "repro", max_examples=1, deadline=None, suppress_health_check=_SUPPRESS,
        database=DirectoryBasedExampleDatabase(local_database_dir()),
        phases=[Phase.explicit, Phase.reuse])
    settings.register_profile(
        "kill", max_examples=count("kill"), deadline=None, derandomize=True,
        database=None, suppress_health_check=_SUPPRESS,
        phases=[Phase.explicit, Phase.generate])


# The Hypothesis release the gate's derandomized draws, coverage and mutants'
# examples-to-kill are measured with (pinned for the gate by constraints.txt;
# pyproject.toml allows a range).
GATE_HYPOTHESIS = "6.170.27"


def hypothesis_note() -> Optional[str]:
    """A line for the run's header when the installed Hypothesis is not the
    gate's release, else None."""
    import hypothesis
    if hypothesis.__version__ == GATE_HYPOTHESIS:
        return None
    return (f"Hypothesis {hypothesis.__version__}: the gate's draws are measured with "
            f"{GATE_HYPOTHESIS} (constraints.txt); this run's derandomized examples may "
            f"differ from the gate's (every coverage claim is still met by construction)")


# Where the environment says it is CI (the CI variable, the main one of those
# Hypothesis reads to load its own "ci" profile) and names no profile, the
# gate's derandomized profile.
CI_ENV_VAR, CI_PROFILE = "CI", "ci"


def default_profile() -> str:
    """The profile a run that names none loads: ci where the CI variable is
    set, else dev."""
    return CI_PROFILE if CI_ENV_VAR in os.environ else DEFAULT


def selected_profile() -> str:
    """GDN_PROFILE, else default_profile() (--hypothesis-profile, read by
    Hypothesis's pytest plugin after this one, names one over both)."""
    name = os.environ.get(ENV_VAR) or default_profile()
    if name not in PROFILES:
        raise ValueError(f"{ENV_VAR} must be one of {PROFILES}, got {name!r}")
    return name
