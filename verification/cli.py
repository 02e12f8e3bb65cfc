"""`gdn-verify`: the suite's command line.

  gdn-verify [run] [--target MODULE[:IMPL]] [--profile dev|ci|nightly|repro]
                   [--seed N] [--examples N] [--properties ID,...] [--scope properties|all]
                   [--strict] [--known-failures FILE] [--junit-xml FILE] [--json FILE]
                   [--jobs N] [--no-compile-cache] [-- PYTEST ARGS]
      the main job: the properties on a target (default gdn_kernels:pallas; the
      current directory is importable) on every core (pytest-xdist), with the
      persistent compilation cache, and the per-property summary (--scope all
      adds this repository's self-tests: the tests command runs those)
  gdn-verify list
      the registered properties (family, what each needs of a target) and
      the seeded-bug mutants (what each breaks, which properties kill it)
  gdn-verify replay FILE... [--target MODULE[:IMPL] | --module MODULE]
      rebuild each counterexample's inputs under its recorded interpret mode
      and XLA flags, rerun its property, print the error table; exit 1 if any
      still fails (--module: on that module, with the file's own impl and mesh)
  gdn-verify mutants [--only NAME ...] [--report-dir DIR] [--jobs N] [--shard I/N]
      the seeded-bug kill report (see verification/mutants)
  gdn-verify merge-reports FILE... [--report-dir DIR]
      join the JSON reports of suite shards (--gdn-shard I/N with
      GDN_STATS_FILE) or of mutation shards (mutants --shard I/N) into one
      verdict: merged-report.json / .md
  gdn-verify bench [BENCH OPTIONS]
      the benchmark harness: runs `python -m benchmarks BENCH OPTIONS` and
      exits with its exit code (see --help there)

Options may come before or after the command; one the command does not take
is an error. Exit codes: those of pytest for `run` (0 all held, 1 a failure,
4 a usage error such as a target that cannot be imported).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from typing import List, Optional

COMMANDS = ("run", "list", "replay", "mutants", "merge-reports", "bench")
# Options shared by the commands, and which commands take each.
SHARED = {"target": ("run", "replay"), "profile": ("run",), "seed": ("run",),
          "examples": ("run", "mutants"), "properties": ("run",), "scope": ("run",),
          "strict": ("run",), "known_failures": ("run",), "junit_xml": ("run",),
          "json": ("run",), "report_dir": ("mutants", "merge-reports"),
          "jobs": ("run", "mutants"), "no_compile_cache": ("run", "mutants"),
          "hang_after": ("run", "replay", "mutants")}


# `run`'s options as pytest options: valued ones (passed as --opt=VALUE: pytest
# guesses its root directory from bare arguments before plugins add options),
# then flags.
PYTEST_VALUED = {"target": "--gdn-target", "profile": "--hypothesis-profile",
                 "seed": "--hypothesis-seed", "examples": "--gdn-examples",
                 "properties": "--gdn-properties", "known_failures": "--gdn-known-failures",
                 "junit_xml": "--junitxml", "json": "--gdn-report"}
PYTEST_FLAGS = {"strict": "--gdn-strict", "no_compile_cache": "--gdn-no-compile-cache"}


AUTO_JOBS_ENV = "PYTEST_XDIST_AUTO_NUM_WORKERS"


def default_jobs() -> int:
    """--jobs when not given: pytest-xdist's `-n auto` count (its
    PYTEST_XDIST_AUTO_NUM_WORKERS if set, else every core)."""
    return int(os.environ.get(AUTO_JOBS_ENV) or 0) or os.cpu_count() or 1


# This command imports `verification` (it is verification.cli) before
# pytest starts, so pytest cannot rewrite that package's __init__ for
# assertion messages and says so in every run; nothing is lost (its
# modules imported later, the tests included, are rewritten as usual),
# so that one warning is filtered, named by its message.
ALREADY_IMPORTED_WARNING = ("ignore:Module already imported so cannot be rewritten; "
                            "verification:pytest.PytestAssertRewriteWarning")


def _suite_args(args) -> List[str]:
    """The pytest arguments of `run`'s options: properties only unless
    --scope all, on every core unless --jobs 1; pytest's short summary lists
    failures and errors alone (the not-checkable reasons are the summary's)."""
    out = ["-p", "gdn_verify", "-q", "-rfE", f"--gdn-scope={args.get('scope') or 'properties'}",
           "-W", ALREADY_IMPORTED_WARNING]
    jobs = args.get("jobs") or default_jobs()
    if jobs > 1 and _have_xdist():
        out += ["-n", str(jobs), "--dist", "worksteal"]
    out += [f"{flag}={args[name]}" for name, flag in PYTEST_VALUED.items()
            if args.get(name) is not None]
    out += [flag for name, flag in PYTEST_FLAGS.items() if args.get(name)]
    return out


def run_suite(args: dict, extra: List[str]) -> int:
    """pytest on the suite, from the current directory (importable, as under
    `python -m pytest`); exit code 5 (no tests collected) counts as failure."""
    import pytest
    if args.get("profile"):
        os.environ["GDN_PROFILE"] = args["profile"]
    if args.get("json"):
        args = dict(args, json=os.path.abspath(args["json"]))
    if not args.get("target") and not os.environ.get("GDN_TARGET"):
        args = dict(args, target=_default_target())
    code = pytest.main(_suite_args(args) + extra)
    if code == 5:
        print("gdn-verify: no tests were collected: failing", file=sys.stderr)
        return 1
    return int(code)


def _have_xdist() -> bool:
    import importlib.util
    return importlib.util.find_spec("xdist") is not None


def _default_target() -> str:
    from .targets import DEFAULT_TARGET
    return DEFAULT_TARGET


# ------------------------------------------------------------------ list
def list_command() -> int:
    from .mutants import MUTANTS
    from .properties import load_all
    props = load_all()
    print(f"properties ({len(props)}):")
    width = max(map(len, props))
    for p in props.values():
        needs = ", ".join(p.needs) or "-"
        print(f"  {p.id:<{width}}  {p.family:<17}  needs: {needs:<28}  {p.doc}")
    print("  (every property also needs what each case asks: the op, its dtype, chunk "
          "size, GVA, packed rows, an initial state)")
    print(f"mutants ({len(MUTANTS)}):")
    width = max(map(len, MUTANTS))
    for m in MUTANTS.values():
        print(f"  {m.name:<{width}}  impls {','.join(m.impls):<12}  "
              f"killers {','.join(m.killers) or '-'}: {m.description}")
    return 0


# ------------------------------------------------------------------ replay
def _restore_environment(record: dict) -> List[str]:
    """Set the recorded interpret mode and environment in this process;
    the warnings of what could not be restored."""
    from .engine import counterexamples, cpu_pool
    warnings = []
    env = record.get("environment")
    if env is None:
        from .engine import compile_settings
        compile_settings.apply()
        cpu_pool.apply()
        return [f"{record['path']}: no recorded environment (written by an older "
                f"gdn-verify): replaying under this process's settings"]
    from jax._src import xla_bridge
    started = bool(xla_bridge._backends)
    for name, value in env.items():
        if os.environ.get(name) == value:
            continue
        if started and name != "GDN_INTERPRET":
            warnings.append(f"cannot restore {name}={value!r} (now {os.environ.get(name)!r}): "
                            f"XLA already started in this process; run the replay alone")
            continue
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    mode = record.get("interpret_mode")
    if mode:
        os.environ["GDN_INTERPRET"] = mode
    if not started:
        cpu_pool.apply()           # a file that recorded no pool size: the suite's
    now = counterexamples.versions()
    for lib in ("jax", "jaxlib"):
        was = record.get("versions", {}).get(lib)
        if was and was != now[lib]:
            warnings.append(f"recorded under {lib} {was}, replaying under {now[lib]}")
    return warnings


def replay(path: str, target: Optional[str], module: Optional[str] = None) -> int:
    """Rerun one counterexample file under its recorded settings; 0 if the
    property now holds, 1 if not. target: the spec to run it on (default:
    the file's own); module: run it on this module instead, keeping the
    file's impl and mesh (the mutation run's baseline replays each killing
    example on gdn_kernels)."""
    import dataclasses
    from .engine import counterexamples
    record = counterexamples.load(path)
    record["path"] = path
    for warning in _restore_environment(record):
        print(f"gdn-verify replay: warning: {warning}", file=sys.stderr)
    from .engine import mesh_worker, watchdog
    from .properties import load_all
    from .engine.registry import PropertyFailure, is_not_checkable
    from .targets import Target, TargetError
    from .tolerance import failure_class, format_table, raised_class
    spec = target or record["target"]
    try:
        if module:
            spec = dataclasses.replace(Target.parse(spec), module_name=module).spec
        resolved = Target.parse(spec)
    except TargetError as err:
        print(f"gdn-verify replay: {err}", file=sys.stderr)
        return 4
    prop = load_all()[record["property"]]
    print(f"replaying {record['property']} on {spec} (interpret mode "
          f"{record.get('interpret_mode', '?')})")
    print(f"case: {record['case']}")
    try:
        with watchdog.instance().watching(functools.partial(_replay_hung, record)):
            rows = mesh_worker.run(prop, resolved, record["case_obj"])
    except PropertyFailure as err:
        print(format_table(err.rows))
        klass = failure_class(err.rows, getattr(record["case_obj"], "dtype", "?"))
        recorded = record.get("failure_class") or klass
        print(f"STILL FAILS: {record['property']} [{klass}]"
              + ("" if recorded == klass else f" (recorded as [{recorded}])"))
        if record.get("diagnosis"):
            print(f"diagnosis when found: {record['diagnosis']['cause']}")
        return 1
    except Exception as err:  # noqa: BLE001 - a crash is a failure too
        print(f"STILL FAILS: {record['property']} [{raised_class(err)}]: {err}")
        return 1
    print(format_table(rows))
    reason = prop.not_checkable(resolved, record["case_obj"])
    if not reason and rows and all(is_not_checkable(r) for r in rows):
        reason = "; ".join(sorted({r.note for r in rows}))
    if reason:
        print(f"not checkable on {spec}: {reason}")
        return 1
    print(f"passes now: {record['property']}")
    return 0


def _replay_hung(record: dict, stalled_s: float) -> None:
    """The watchdog's handler in a replay: the verdict, with the stacks of
    every thread written beside the file; the process then ends (exit
    watchdog.HUNG_EXIT, a failure)."""
    from .engine import watchdog
    stacks = os.path.splitext(record["path"])[0] + ".replay-stacks.txt"
    threads, cause = watchdog.stacks_and_cause()
    with open(stacks, "w") as f:
        f.write(threads)
    print(f"STILL FAILS: {record['property']} [{watchdog.HUNG}]: no progress in "
          f"{stalled_s:.0f} s with the process idle" + (f": {cause}" if cause else "")
          + f"; stacks: {stacks}", flush=True)


def _environment_key(path: str) -> str:
    with open(path) as f:
        record = json.load(f)
    return json.dumps([record.get("environment"), record.get("interpret_mode")],
                      sort_keys=True)


def replay_all(paths: List[str], target: Optional[str], module: Optional[str] = None) -> int:
    """Rerun every file (see replay); 1 if any still fails, naming them.
    Files recorded under different environments replay in a fresh process
    each, so every one gets its own XLA flags."""
    groups = {}
    for path in paths:
        groups.setdefault(_environment_key(path), []).append(path)
    if len(groups) > 1:
        failing = []
        for path in paths:
            cmd = [sys.executable, "-m", "gdn_verify.run", "verification.cli", "replay", path]
            cmd += (["--target", target] if target else []) + (["--module", module]
                                                               if module else [])
            if subprocess.run(cmd).returncode:
                failing.append(path)
    else:
        failing = [path for path in paths if replay(path, target, module)]
    print(f"replayed {len(paths)} counterexample(s): "
          + (f"{len(failing)} do not pass (still failing, or not checkable): {', '.join(failing)}"
             if failing else "all pass"))
    return 1 if failing else 0


def merge_reports(files: List[str], report_dir: str) -> int:
    """Write merged-report.json / .md; 0 when every shard passed."""
    from .engine.reports import markdown, merge
    report = merge(files)
    text = markdown(report)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "merged-report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(report_dir, "merged-report.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if report["passed"] else 1


# ------------------------------------------------------------------ parsing
def version_text() -> str:
    """gdn-verify's installed version and those of what decides its runs."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    deps = ", ".join(f"{name} {of(name)}" for name in ("jax", "jaxlib", "hypothesis", "pytest"))
    return f"gdn-verify {of('gdn-verify')} ({deps})"


class _VersionAction(argparse.Action):
    """--version: print version_text() and exit; the versions are read only
    when asked (not on every gdn-verify start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def _shared_options(parser, suppress: bool) -> None:
    """The shared options; suppress: leave them out of the namespace unless
    given (a subcommand's parser must not overwrite the main parser's)."""
    from .engine.profiles import PROFILES
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--target", default=default, metavar="MODULE[:IMPL]",
                        help="the kernel module to verify (default gdn_kernels:pallas)")
    parser.add_argument("--profile", default=default, choices=PROFILES)
    parser.add_argument("--seed", type=int, default=default,
                        help="Hypothesis seed (--hypothesis-seed)")
    parser.add_argument("--examples", type=int, default=default,
                        help="examples per property (run) or per mutant run (mutants)")
    parser.add_argument("--properties", default=default, metavar="ID[,ID...]",
                        help="only these properties ('all', 'sharded-subset')")
    parser.add_argument("--scope", default=default, choices=("properties", "all"),
                        help="properties only, or with this repository's self-tests")
    parser.add_argument("--strict", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="a not-checkable property fails")
    parser.add_argument("--known-failures", default=default, metavar="FILE",
                        help="known failures: XFAIL; XPASS fails")
    parser.add_argument("--junit-xml", default=default, metavar="FILE",
                        help="write a JUnit XML report (one test case per property)")
    parser.add_argument("--json", default=default, metavar="FILE",
                        help="write the JSON report (verdicts, per-property statistics)")
    parser.add_argument("--report-dir", default=default, metavar="DIR")
    parser.add_argument("--jobs", type=int, default=default,
                        help="processes at once (run: pytest-xdist workers; mutants: "
                             "mutant runs); default: every core, or "
                             "PYTEST_XDIST_AUTO_NUM_WORKERS as for pytest -n auto")
    parser.add_argument("--no-compile-cache", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="do not use the persistent compilation cache")
    parser.add_argument("--hang-after", type=float, default=default, metavar="SECONDS",
                        help="an example that runs this long with its process idle is "
                             "FAILED as hung and its process ends (default 300; 0: off; "
                             "env GDN_HANG_AFTER_S)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _shared_options(parser, suppress=False)
    parser.add_argument("--version", action=_VersionAction,
                        help="the installed gdn-verify, and the jax, jaxlib, Hypothesis and "
                             "pytest it runs with")
    sub = parser.add_subparsers(dest="command")
    _shared_options(sub.add_parser("run", help="run the suite (default)"), suppress=True)
    _shared_options(sub.add_parser("list", help="list properties and mutants"), suppress=True)
    rep = sub.add_parser("replay", help="replay counterexample files")
    _shared_options(rep, suppress=True)
    rep.add_argument("files", nargs="+")
    rep.add_argument("--module", default=None,
                     help="run each file on this module, keeping its impl and mesh")
    mut = sub.add_parser("mutants", help="seeded-bug kill report")
    _shared_options(mut, suppress=True)
    mut.add_argument("--only", nargs="*", default=None)
    mut.add_argument("--shard", default=None, metavar="I/N",
                     help="run every N-th mutant run and baseline property, from the I-th")
    merge = sub.add_parser("merge-reports", help="join suite shard reports into one verdict")
    _shared_options(merge, suppress=True)
    merge.add_argument("files", nargs="+")
    sub.add_parser("bench", add_help=False,
                   help="benchmark harness (python -m benchmarks; gdn-verify bench --help)")
    return parser


def bench_command(bench_args: List[str]) -> int:
    """`python -m benchmarks BENCH_ARGS` as a child process, with the
    benchmarks/ beside this package importable (the suite never imports the
    harness, which depends on it); its exit code, 128 + N when signal N
    ended it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    code = subprocess.call([sys.executable, "-m", "gdn_verify.run", "benchmarks", *bench_args],
                           env=env)
    return code if code >= 0 else 128 - code


def parse(argv: List[str]):
    """(options as a dict, pytest args after --); SystemExit 2 with a message
    for an option the command does not take."""
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    command = args.get("command") or "run"
    args["command"] = command
    for name, commands in SHARED.items():
        given = args.get(name) not in (None, False)
        if given and command not in commands:
            parser.error(f"--{name.replace('_', '-')} does not apply to `{command}` "
                         f"(it applies to: {', '.join(commands)})")
    if extra and command != "run":
        parser.error(f"pytest arguments after -- apply only to `run`, not `{command}`")
    return args, extra


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every option belongs to the benchmark's own parser
        return bench_command(argv[1:])
    args, extra = parse(argv)
    command = args["command"]
    from .targets import make_importable
    make_importable(os.getcwd())          # a target module here imports (run, replay, mutants)
    if command == "list":
        return list_command()
    if command == "merge-reports":
        return merge_reports(args["files"], args.get("report_dir") or ".")
    # the suite's compile settings and intra-op pool, for the processes `run`
    # and `mutants` start (a replay restores the ones its file records)
    from .engine import compile_settings, cpu_pool, watchdog
    if args.get("hang_after") is not None:   # this process and those it starts
        os.environ[watchdog.AFTER_ENV] = str(args["hang_after"])
    if command == "replay":
        return replay_all(args["files"], args.get("target"), args.get("module"))
    compile_settings.apply()
    cpu_pool.apply()
    if command == "mutants":
        from .engine import compile_cache
        compile_cache.configure(not args.get("no_compile_cache"))
        from .mutants.runner import main as mutants_main
        from .engine.shards import parse_shard
        shard = parse_shard(args["shard"]) if args.get("shard") else None
        return mutants_main(args.get("only"), args.get("report_dir") or ".",
                            args.get("examples"), args.get("jobs") or default_jobs(),
                            shard)
    return run_suite(args, extra)


def exit_with(code: int) -> None:
    """End this process with status `code`: Python's exit handlers run and
    the output is flushed, then the process ends without the interpreter's
    teardown, where a kernel's framework may abort after the verdict is
    printed (an MLX function compiled with mx.compile: "terminate called
    without an active exception", status 134), so the status is always the
    verdict's."""
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # closed or broken: nothing more to say
            pass
    os._exit(int(code or 0))


def entry() -> None:
    """The gdn-verify command: main's status, whatever tears down after it."""
    exit_with(main())


if __name__ == "__main__":
    entry()
