"""The persistent compilation cache of the suite's processes, on by default.

The suite is compile-bound (verification/engine/compile_settings.py), and a rerun
after an edit compiles mostly the programs it compiled before: the oracle,
the reference, every kernel function the edit did not touch. With the
cache on, XLA's compiled executables are kept in a directory and read back
by any later process whose program, compile options, XLA flags, devices and
jax/jaxlib versions match (JAX's cache key); a changed kernel is a changed
program, so it never reads an entry of the old one. pytest-xdist workers
share the directory (JAX writes each entry whole under its key).

  directory  JAX_COMPILATION_CACHE_DIR if set, else <user cache>/gdn-verify/jax
             (XDG_CACHE_HOME, or ~/.cache)
  off        --gdn-no-compile-cache (gdn-verify --no-compile-cache) or
             GDN_NO_COMPILE_CACHE=1

The program store (verification/engine/program_store.py) lives in its
subdirectory gdn-programs/ and follows it: on, off and read-only with it.

The settings go into the environment too, so the processes the suite starts
(xdist workers, mesh workers, mutant runs) use the same cache; a process
started with JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS set keeps it (the
mutation runner's processes read the cache and never write it).
"""

from __future__ import annotations

import os
from typing import MutableMapping

DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
MIN_SIZE_ENV = "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"
ENABLE_ENV = "JAX_ENABLE_COMPILATION_CACHE"
OPT_OUT_ENV = "GDN_NO_COMPILE_CACHE"


def default_dir(environ: MutableMapping[str, str] = os.environ) -> str:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gdn-verify", "jax")


def opted_out(environ: MutableMapping[str, str] = os.environ) -> bool:
    return environ.get(OPT_OUT_ENV, "") not in ("", "0")


def settings(enabled: bool = True, environ: MutableMapping[str, str] = os.environ):
    """(jax config values, header line) for the cache on or off; the
    environment gets the same settings for the processes started later."""
    if not enabled or opted_out(environ):
        environ[OPT_OUT_ENV] = "1"
        environ[ENABLE_ENV] = "false"
        return {"jax_enable_compilation_cache": False}, "compile cache off"
    path = environ.setdefault(DIR_ENV, default_dir(environ))
    environ.setdefault(MIN_TIME_ENV, "0")
    environ.setdefault(MIN_SIZE_ENV, "0")
    values = {"jax_enable_compilation_cache": True, "jax_compilation_cache_dir": path,
              "jax_persistent_cache_min_compile_time_secs": float(environ[MIN_TIME_ENV]),
              "jax_persistent_cache_min_entry_size_bytes": int(environ[MIN_SIZE_ENV])}
    mode = "read-only" if values["jax_persistent_cache_min_compile_time_secs"] >= 1e8 \
        else "read-write"
    return values, f"compile cache {path} ({mode}; --gdn-no-compile-cache: off)"


def configure(enabled: bool = True) -> str:
    """Turn the cache on (or off) for this process and the ones it starts,
    before its first compile; returns a line for the report header."""
    import jax
    values, line = settings(enabled)
    for name, value in values.items():
        jax.config.update(name, value)
    return line
