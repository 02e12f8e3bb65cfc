"""The suite's tests: test_properties.py (one test per registered property,
generated; the file the pytest plugin runs on a target) and the meta-tests
that hold the suite, the kernels and the docs to their word."""
