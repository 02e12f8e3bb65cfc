"""`gdn-verify`: the suite's command line.

  gdn-verify [run] [--target MODULE[:IMPL]] [--profile dev|ci|nightly|repro] [-- PYTEST ARGS]
      run the verification suite on a target and print the per-property
      summary (examples, worst error per tensor vs bound, compiles, time)
  gdn-verify replay FILE... [--target MODULE[:IMPL] | --module MODULE]
      rebuild each counterexample's inputs, rerun its property, print the
      error table; exit 1 if any still fails (--module: on that module,
      with the file's own impl and mesh)
  gdn-verify mutants [--only NAME ...] [--report-dir DIR] [--jobs N]
      the seeded-bug kill report (see verification/mutants); --shard I/N
      runs one shard of it
  gdn-verify merge-reports FILE... [--report-dir DIR]
      join the JSON reports of suite shards (--gdn-shard I/N with
      GDN_STATS_FILE) or of mutation shards (mutants --shard I/N) into one
      verdict: merged-report.json / .md
  gdn-verify bench [BENCH OPTIONS]
      the benchmark harness, same as `python -m benchmarks` (see --help there)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional


def _suite_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def run_suite(target: Optional[str], profile: Optional[str], extra: List[str]) -> int:
    """pytest on the suite; exit code 5 (no tests collected) counts as failure."""
    import pytest
    args = [_suite_dir(), "-p", "verification.plugin", "-q"]
    if target:
        args += ["--gdn-target", target]
    if profile:
        os.environ["GDN_PROFILE"] = profile
        args += ["--hypothesis-profile", profile]
    code = pytest.main(args + extra)
    if code == 5:
        print("gdn-verify: no tests were collected: failing", file=sys.stderr)
        return 1
    return int(code)


def replay(path: str, target: Optional[str], module: Optional[str] = None) -> int:
    """Rerun one counterexample file; 0 if the property now holds, 1 if not.
    target: the spec to run it on (default: the file's own); module: run it
    on this module instead, keeping the file's impl and mesh (the mutation
    run's baseline replays each killing example on gdn_kernels)."""
    import dataclasses
    from . import counterexamples
    from .registry import PropertyFailure, load_all
    from .targets import Target
    from .tolerance import format_table

    record = counterexamples.load(path)
    spec = target or record["target"]
    if module:
        spec = dataclasses.replace(Target.parse(spec), module_name=module).spec
    prop = load_all()[record["property"]]
    print(f"replaying {record['property']} on {spec}")
    print(f"case: {record['case']}")
    try:
        rows = prop.run(Target.parse(spec), record["case_obj"])
    except PropertyFailure as err:
        print(format_table(err.rows))
        print(f"STILL FAILS: {record['property']}")
        return 1
    except Exception as err:  # noqa: BLE001 - a crash is a failure too
        print(f"STILL FAILS (raised {type(err).__name__}): {err}")
        return 1
    print(format_table(rows))
    print(f"passes now: {record['property']}")
    return 0


def replay_all(paths: List[str], target: Optional[str], module: Optional[str] = None) -> int:
    """Rerun every file (see replay); 1 if any still fails, naming them."""
    failing = [path for path in paths if replay(path, target, module)]
    print(f"replayed {len(paths)} counterexample(s): "
          + (f"{len(failing)} still fail: {', '.join(failing)}" if failing else "all pass"))
    return 1 if failing else 0


def merge_reports(files: List[str], report_dir: str) -> int:
    """Write merged-report.json / .md; 0 when every shard passed."""
    import json
    from .reports import markdown, merge
    report = merge(files)
    text = markdown(report)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "merged-report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(report_dir, "merged-report.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if report["passed"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    from .profiles import PROFILES
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # every option belongs to the benchmark's own parser
        from benchmarks.__main__ import main as bench_main
        return bench_main(argv[1:])
    # the suite's compile settings, for replay in this process and for the
    # processes `run` and `mutants` start (the benchmarks keep XLA's defaults)
    from . import compile_settings
    compile_settings.apply()
    extra: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(prog="gdn-verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    run_p = sub.add_parser("run", help="run the suite (default)")
    for p in (parser, run_p):
        p.add_argument("--target", default=None)
        p.add_argument("--profile", default=None,
                       choices=PROFILES)
    rep = sub.add_parser("replay", help="replay counterexample files")
    rep.add_argument("files", nargs="+")
    rep.add_argument("--target", default=None)
    rep.add_argument("--module", default=None,
                     help="run each file on this module, keeping its impl and mesh")
    mut = sub.add_parser("mutants", help="seeded-bug kill report")
    mut.add_argument("--only", nargs="*", default=None)
    mut.add_argument("--report-dir", default=".")
    mut.add_argument("--examples", type=int, default=None)
    mut.add_argument("--shard", default=None, metavar="I/N",
                     help="run every N-th mutant run and baseline property, from the I-th")
    mut.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                     help="mutant runs at once, each a fresh pytest process "
                          "(default: the available cores)")
    merge = sub.add_parser("merge-reports", help="join suite shard reports into one verdict")
    merge.add_argument("files", nargs="+")
    merge.add_argument("--report-dir", default=".")
    sub.add_parser("bench", add_help=False,
                   help="benchmark harness (python -m benchmarks; gdn-verify bench --help)")
    args = parser.parse_args(argv)
    if args.command == "replay":
        return replay_all(args.files, args.target, args.module)
    if args.command == "merge-reports":
        return merge_reports(args.files, args.report_dir)
    if args.command == "mutants":
        from .mutants.runner import main as mutants_main
        from .reports import parse_shard
        shard = parse_shard(args.shard) if args.shard else None
        return mutants_main(args.only, args.report_dir, args.examples, args.jobs, shard)
    return run_suite(args.target, args.profile, extra)


if __name__ == "__main__":
    sys.exit(main())
