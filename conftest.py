"""Repo-level pytest configuration. The suite's plugin is installed under
the pytest11 entry point `gdn_verify` (gdn_verify/pytest_plugin.py, which
activates verification/plugin.py once a target is named); this
repository activates it through `gdn_target = gdn_kernels:pallas` in
pyproject.toml, so `python -m pytest` here runs the whole suite, self-tests
included."""
