"""Benchmark harness of gdn_kernels: time, compile time and compiled temp
memory of `gdn_decoupled_conv1d` and `gated_delta_rule`, forward and
forward+backward, per implementation over a size ladder; optional suite
throughput. Run `python -m benchmarks --help` (or `gdn-verify bench`).

Modules:
  workloads    sizes (from the head layouts of strategies/shapes.py), seeded
               inputs, the benchmarked functions per (op, impl, mode)
  timing       compile (cached once per shape), budgets, interleaved timing
  packed       packed-sequence overhead: segment_ids against None, interleaved
  throughput   pytest throughput under the dev / ci profiles (subprocess)
  report       ratios, log-log growth fits, acceptance, JSON / Markdown / PNG
  profile_packed  where the extra time of packed sequences goes (public API:
               whole ops, thunk times from profiler traces)
  build_cost   where a new program's build time goes: trace, lower and
               compile seconds, StableHLO ops, the Pallas kernels' DMAs
"""
