"""The pytest11 entry point `gdn_verify`: the suite's command-line options,
and nothing else until a target is named.

Loaded by pytest at start-up in every session of an environment where
gdn-verify is installed, it imports nothing of the suite: a project's own
packages named like the suite's (verification, strategies, benchmarks,
gdn_kernels) and its tests are untouched. A target, from (first found)

  --gdn-target MODULE[:IMPL][@AXIS=N,...]   the GDN_TARGET environment variable
  gdn_target = ...                          in the pytest ini file

loads the suite from this installation (gdn_verify.load_suite, ahead of any
package of the same names on sys.path) and activates its plugin
(verification/plugin.py).
"""

from __future__ import annotations

import importlib
import os

import pytest

from . import SuiteShadowed, load_suite

TARGET_OPTION, TARGET_INI, TARGET_ENV = "--gdn-target", "gdn_target", "GDN_TARGET"
SCOPES = ("properties", "all")
EXAMPLES_ENV = "GDN_EXAMPLES"      # the same as --gdn-examples
REPORT_OPTION, REPORT_ENV = "--gdn-report", "GDN_STATS_FILE"
PROGRESS_OPTION, PROGRESS_EVERY_S = "--gdn-progress-every", 10.0
HANG_OPTION = "--gdn-hang-after"
# The suite's plugin module, imported only once a target is named.
SUITE_PLUGIN = "verification.plugin"


def pytest_addoption(parser):
    group = parser.getgroup("gdn-verify", "GDN kernel verification (active with a target)")
    group.addoption(TARGET_OPTION, default=None, metavar="MODULE[:IMPL]",
                    help=f"verify this kernel module (env {TARGET_ENV}; ini {TARGET_INI}); "
                         "without a target the plugin does nothing")
    group.addoption("--gdn-properties", default=None, metavar="ID[,ID...]",
                    help="run only these registered properties (by id; 'all' = every "
                         "property, no other test; 'sharded-subset' = those declared "
                         "on_sharded_target)")
    group.addoption("--gdn-scope", default=None, choices=SCOPES,
                    help="what runs: the properties, or all tests including this "
                         "repository's self-tests (default: all for gdn_kernels targets, "
                         "properties for any other)")
    group.addoption("--gdn-strict", action="store_true", default=False,
                    help="a property that cannot check an example on the target fails "
                         "instead of reporting 'not checkable'")
    group.addoption("--gdn-known-failures", default=None, metavar="FILE",
                    help="known failures of a partial implementation (property | tensor "
                         "| reason a line): XFAIL; one that passes is XPASS and fails")
    group.addoption("--gdn-examples", default=None, type=int, metavar="N",
                    help="examples per property (before its weight) instead of the "
                         f"profile's (env {EXAMPLES_ENV})")
    group.addoption("--gdn-no-compile-cache", action="store_true", default=False,
                    help="do not use the persistent compilation cache (default: on, in "
                         "JAX_COMPILATION_CACHE_DIR or <user cache>/gdn-verify/jax)")
    group.addoption("--gdn-shard", default=None, metavar="I/N",
                    help="run only shard I of N (1-based) of the selected tests: a stable "
                         "split by test id, for CI jobs whose reports `gdn-verify "
                         "merge-reports` joins")
    group.addoption(REPORT_OPTION, default=None, metavar="FILE",
                    help=f"write the run's JSON report here: verdicts and per-property "
                         f"statistics (env {REPORT_ENV}, an alias)")
    group.addoption(PROGRESS_OPTION, default=PROGRESS_EVERY_S, type=float, metavar="SECONDS",
                    help="while a property runs, a line of its examples done of planned "
                         "every SECONDS of it (default %(default)s; 0: after every "
                         "example); under pytest-xdist each worker's lines go to standard "
                         "error, named by the worker")
    group.addoption(HANG_OPTION, default=None, type=float, metavar="SECONDS",
                    help="an example that runs SECONDS with its process idle is FAILED as "
                         "hung (its stacks in a file beside its counterexample) and its "
                         "process ends; under pytest-xdist the worker is replaced and the "
                         "run goes on (default 300; 0: off; env GDN_HANG_AFTER_S)")
    parser.addini(TARGET_INI, "the kernel module the gdn-verify suite runs on "
                              "(activates the suite)", default=None)


def requested_target(config):
    """The target spec this session asks for, or None (the plugin stays inert)."""
    return (config.getoption(TARGET_OPTION, default=None) or os.environ.get(TARGET_ENV)
            or config.getini(TARGET_INI) or None)


def report_path(config):
    """Where the JSON report goes (--gdn-report, else GDN_STATS_FILE; a
    relative path from where pytest was started), or None."""
    path = config.getoption(REPORT_OPTION, default=None) or os.environ.get(REPORT_ENV)
    return os.path.join(str(config.invocation_params.dir), path) if path else None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    spec = requested_target(config)
    if not spec:
        return
    try:
        load_suite()
    except SuiteShadowed as err:
        raise pytest.UsageError(str(err)) from None
    importlib.import_module(SUITE_PLUGIN).activate(config, spec)
