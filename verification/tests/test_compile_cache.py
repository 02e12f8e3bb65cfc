"""The persistent compilation cache the suite turns on by default: a rerun
reads what a run wrote, a mutated kernel never reads the clean kernel's
program, `--gdn-no-compile-cache` turns it off, and the mutation runner's
processes only read it."""

import json
import os
import subprocess
import sys

from ..engine import compile_cache
from ..mutants.runner import _env as mutant_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One process: the clean kernel's VJP program on a case, then (in-memory
# caches dropped) the same program again, then a mutant's whose patch changes
# this case's program (a patch on a path the case does not take, e.g. an
# off-diagonal inverse block at one block a chunk, leaves the same program,
# which the cache then rightly serves): the programs read from the
# persistent cache at each step.
SCRIPT = r'''
import json, sys
from verification.engine import compile_cache
compile_cache.configure(True)
import jax
from strategies.cases import DeltaRuleCase
from verification.engine import runners
from verification.targets import Target
case = DeltaRuleCase(batch=1, seq_len=20, k_heads=1, group=2, dk=16, dv=16, chunk=16,
                     dtype="float32", state_dtype="float32", seed=3)

def hits_of(spec):
    runners.release_executables_if_needed(fraction=0.0)     # drop in-memory programs
    h0, n0 = runners.cache_hit_count(), runners.compile_count()
    runners.target_vjp(Target.parse(spec), case)
    return {"hits": runners.cache_hit_count() - h0, "built": runners.compile_count() - n0}

print(json.dumps({"clean": hits_of("gdn_kernels:xla"), "again": hits_of("gdn_kernels:xla"),
                  "mutant": hits_of("gdn_mutant_beta_applied_twice:xla")}))
'''


def test_a_mutant_never_reads_the_clean_kernels_program(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update({compile_cache.DIR_ENV: str(tmp_path / "cache"),
                "GDN_MUTANT_DIR": str(tmp_path / "mutants")})
    env.pop(compile_cache.OPT_OUT_ENV, None)
    (tmp_path / "mutants").mkdir()
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["clean"]["hits"] == 0 and counts["clean"]["built"] >= 1
    # the rerun reads the kernel's VJP program back (the cache works); the
    # mutant compiles its own and reads none of what the rerun read
    assert counts["again"]["hits"] >= 1, counts
    # every program of the rerun came from the cache, each counted once
    assert counts["again"]["hits"] == counts["again"]["built"] == counts["clean"]["built"], counts
    assert counts["mutant"]["hits"] < counts["again"]["hits"], counts
    assert counts["mutant"]["built"] - counts["mutant"]["hits"] >= 1, counts
    assert os.listdir(tmp_path / "cache")


def test_settings_default_and_opt_out(tmp_path):
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    values, line = compile_cache.settings(True, environ)
    assert environ[compile_cache.DIR_ENV] == str(tmp_path / "gdn-verify" / "jax")
    assert values["jax_compilation_cache_dir"] == environ[compile_cache.DIR_ENV]
    assert environ[compile_cache.MIN_TIME_ENV] == "0" and "read-write" in line
    for enabled, off in ((True, {compile_cache.OPT_OUT_ENV: "1"}), (False, {})):
        values, line = compile_cache.settings(enabled, off)
        assert line == "compile cache off" and values == {"jax_enable_compilation_cache": False}
        assert off[compile_cache.ENABLE_ENV] == "false" and off[compile_cache.OPT_OUT_ENV] == "1"


def test_mutant_processes_read_the_cache_and_never_write_it(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.DIR_ENV, str(tmp_path))
    env = mutant_env(str(tmp_path / "run"), str(tmp_path / "stats.json"))
    assert env[compile_cache.DIR_ENV] == str(tmp_path)
    assert float(env[compile_cache.MIN_TIME_ENV]) >= 1e8
    values, line = compile_cache.settings(True, dict(env))
    assert "read-only" in line and values["jax_persistent_cache_min_compile_time_secs"] >= 1e8


def test_the_header_names_the_cache_and_the_option_turns_it_off(tmp_path):
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
            "verification/tests/test_properties.py", "--gdn-target", "gdn_kernels:xla"]
    env = dict(os.environ, **{compile_cache.DIR_ENV: str(tmp_path)})
    on = subprocess.run(base + ["-p", "no:xdist"], capture_output=True, text=True, cwd=ROOT,
                        env=env, timeout=300)
    assert f"compile cache {tmp_path}" in on.stdout, on.stdout[-2000:]
    off = subprocess.run(base + ["--gdn-no-compile-cache"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert "compile cache off" in off.stdout, off.stdout[-2000:]
