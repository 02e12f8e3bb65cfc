"""The engine: how a run happens, whatever the target.

    registry.py          @prop: the properties' one registry
    harness.py           the test generated per property, its verdict, statistics
    claims.py            the cases that meet each coverage claim, per profile
    runners.py           jitted target / oracle / reference runs, compile counts
    profiles.py          the Hypothesis profiles (dev, ci, nightly, repro, kill)
    compile_settings.py  XLA:CPU flags of the suite's processes
    cpu_pool.py          XLA:CPU's intra-op pool size (batched LAPACK calls' deadlock)
    watchdog.py          an example that waits for ever: FAILED as hung, its stacks
    compile_cache.py     the persistent compilation cache
    program_store.py     compiled programs kept across runs, keyed by the traced program
    picture.py           the run's picture (properties x tensors) and the kill matrix, as SVG
    counterexamples.py   counterexample files and their replay
    diagnosis.py         which one change makes a failing case pass (its cause)
    known_failures.py    --gdn-known-failures
    shards.py, reports.py, shared_db.py   sharded runs, merged reports, a shared
                         example database
    mesh_worker.py       checks that need more devices than the process has

It imports the targets (verification.targets) and the tolerance policy, and
runs the properties (verification.properties), never the front ends
(verification.plugin, verification.cli).
"""
