"""Repo-level pytest configuration: the Hypothesis profiles (dev, ci, nightly,
repro; see verification/profiles.py) are registered and the selected one
loaded by the suite's plugin, which also adds --gdn-target, writes
counterexample files and prints the per-property summary."""

pytest_plugins = ["verification.plugin"]
