#!/usr/bin/env bash
# gdn-verify gate: verify a kernel in the repository this is run from, for
# any CI system (the reusable GitHub workflow .github/workflows/gate.yml runs
# exactly this script).
#
#   gdn-verify-gate.sh --suite SPEC --target MODULE[:IMPL] [--profile ci]
#                      [--known-failures FILE] [--requirements "PIP ARGS"]
#                      [--python python3] [--venv DIR] [--report-dir DIR]
#                      [--examples N] [-- MORE gdn-verify OPTIONS]
#
#   --suite          where to install gdn-verify from: a directory (a checkout
#                    of it) or a pip requirement ("gdn-verify[test] @ git+https://...")
#   --target         the module to verify (it exports GDN_KERNEL, see
#                    docs/verify-your-kernel.md), importable from this directory
#   --profile        Hypothesis profile (default ci: derandomized, the same
#                    examples on every run of the same code)
#   --known-failures a known-failures file (property | tensor | reason)
#   --requirements   extra pip arguments for the kernel's own dependencies
#                    (e.g. "-r requirements.txt"); a pyproject.toml or setup.py
#                    here is installed too (pip install -e .)
#   --venv           the virtual environment (default .gdn-verify-venv; reused
#                    when it exists)
#   --report-dir     where gdn-verify.json, gdn-verify.xml (JUnit) and the
#                    counterexamples go (default gdn-verify-report)
#
# Exit status: gdn-verify's (0: every property held or is not checkable, or
# failed as listed in the known-failures file; 1: a property failed; 2 or 4:
# a usage error, e.g. a target that cannot be imported); 3: the install failed.
set -uo pipefail

suite="" target="" profile="ci" known="" requirements="" python="python3"
venv=".gdn-verify-venv" report_dir="gdn-verify-report" examples=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --suite) suite="$2"; shift 2 ;;
        --target) target="$2"; shift 2 ;;
        --profile) profile="$2"; shift 2 ;;
        --known-failures) known="$2"; shift 2 ;;
        --requirements) requirements="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        --report-dir) report_dir="$2"; shift 2 ;;
        --examples) examples="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "gdn-verify-gate: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
if [ -z "$suite" ] || [ -z "$target" ]; then
    echo "gdn-verify-gate: --suite and --target are required" >&2
    exit 2
fi

# --- install: the suite, the kernel's requirements, the kernel's project ---
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || { echo "gdn-verify-gate: cannot create $venv" >&2; exit 3; }
fi
. "$venv/bin/activate"
if [ -d "$suite" ]; then
    suite_req="$(cd "$suite" && pwd)[test]"
else
    suite_req="$suite"
fi
python -m pip install --quiet --upgrade pip >/dev/null
# the Hypothesis release the suite's derandomized draws are measured with
# (constraints.txt beside this script's checkout of the suite)
constraints="$(cd "$(dirname "$0")/.." && pwd)/constraints.txt"
pins=()
[ -f "$constraints" ] && pins=(-c "$constraints")
python -m pip install --quiet ${pins[@]+"${pins[@]}"} "$suite_req" || { echo "gdn-verify-gate: cannot install $suite" >&2; exit 3; }
if [ -n "$requirements" ]; then
    # word splitting intended: pip arguments
    # shellcheck disable=SC2086
    python -m pip install --quiet ${pins[@]+"${pins[@]}"} $requirements || { echo "gdn-verify-gate: cannot install $requirements" >&2; exit 3; }
fi
if [ -f pyproject.toml ] || [ -f setup.py ]; then
    python -m pip install --quiet ${pins[@]+"${pins[@]}"} -e . || { echo "gdn-verify-gate: cannot install this project" >&2; exit 3; }
fi

# --- the gate ---------------------------------------------------------------
mkdir -p "$report_dir"
args=(--target "$target" --profile "$profile" --json "$report_dir/gdn-verify.json"
      --junit-xml "$report_dir/gdn-verify.xml")
[ -n "$known" ] && args+=(--known-failures "$known")
[ -n "$examples" ] && args+=(--examples "$examples")
GDN_COUNTEREXAMPLES="$report_dir/counterexamples" gdn-verify run "${args[@]}" "${extra[@]}"
rc=$?
echo "gdn-verify-gate: target $target, profile $profile: exit $rc (reports in $report_dir)"

# --- the job's step summary, where the CI system asks for one (GitHub Actions) ---
if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$report_dir/gdn-verify.json" ]; then
    {
        echo "## gdn-verify: \`$target\` (profile $profile): exit $rc"
        echo
        # its exit code is the verdict's (1 on a red run): the table is what counts here
        gdn-verify merge-reports "$report_dir/gdn-verify.json" \
            --report-dir "$report_dir/summary" >/dev/null 2>&1
        if [ -f "$report_dir/summary/merged-report.md" ]; then
            cat "$report_dir/summary/merged-report.md"
        else
            echo "(the report could not be summarised: see the uploaded $report_dir/)"
        fi
    } >> "$GITHUB_STEP_SUMMARY"
fi
exit "$rc"
