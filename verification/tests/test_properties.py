"""Every registered property (verification/properties/) as a Hypothesis test,
generated from the registry: test_<property id>. Nothing is written here by
hand; a new property appears as soon as it is declared."""

from ..engine.harness import hypothesis_test
from ..properties import load_all

for _prop in load_all().values():
    globals()[f"test_{_prop.id}"] = hypothesis_test(_prop)
del _prop
