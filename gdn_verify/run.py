"""python -m gdn_verify.run MODULE [ARGS...]: run the suite's MODULE as
`python -m MODULE` would, its packages loaded from this installation first
(gdn_verify.load_suite): the suite's subprocesses (mesh and mutation
workers, replays, the benchmarks) start so, from any directory, whatever
packages of the same names the directory holds."""

import runpy
import sys

from . import load_suite


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m gdn_verify.run MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    load_suite()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
