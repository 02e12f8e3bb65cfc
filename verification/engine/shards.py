"""How a run is split into shards and how its wall time projects onto more
cores: the one split rule of suite tests and mutant runs, shared by the
plugin, the mutation runner and the merged reports."""

from __future__ import annotations

from typing import List, Optional, Tuple


def parse_shard(text: str) -> Tuple[int, int]:
    """"I/N" -> (I, N) with 1 <= I <= N (ValueError naming the option otherwise)."""
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise ValueError(f"shard: expected I/N with 1 <= I <= N, got {text!r}")
    return i, n


def shard_of(items: list, shard: Optional[Tuple[int, int]]) -> list:
    """Items k with k % N == I - 1 for shard (I, N) (all of them for None):
    the one split rule of suite tests (by sorted node id) and mutant runs."""
    if shard is None:
        return list(items)
    i, n = shard
    return [item for k, item in enumerate(items) if k % n == i - 1]


PROJECTED_CORES = (1, 2, 4, 8, 16)


def projected_wall(seconds: List[float], cores: int) -> float:
    """Wall time of independent jobs of these durations on `cores` parallel
    workers, longest first onto the least-loaded worker (LPT scheduling; a
    job is one process, compile-bound on one core)."""
    loads = [0.0] * max(1, cores)
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def projection_line(seconds: List[float], what: str) -> str:
    """"projected ... wall: 1 core 1800 s, 2 cores 900 s, ..." for these jobs."""
    parts = ", ".join(f"{c} core{'s' if c > 1 else ''} {projected_wall(seconds, c):.0f} s"
                      for c in PROJECTED_CORES)
    return f"projected {what} wall (one job per core, from the measured times): {parts}"
