"""The implementation under test: MODULE[:IMPL].

MODULE must expose the contract's two functions. With ":IMPL" the suite
passes impl=IMPL; without it, nothing (the module's own default). Chosen by
--gdn-target or the GDN_TARGET environment variable.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Optional

ENV_VAR = "GDN_TARGET"
DEFAULT_TARGET = "gdn_kernels:pallas"


@dataclasses.dataclass(frozen=True)
class Target:
    """A module implementing docs/contract.md, plus an optional impl= value."""
    module_name: str
    impl: Optional[str] = None

    @classmethod
    def parse(cls, spec: Optional[str] = None) -> "Target":
        spec = spec or os.environ.get(ENV_VAR) or DEFAULT_TARGET
        module_name, _, impl = spec.partition(":")
        target = cls(module_name=module_name.strip(), impl=impl.strip() or None)
        target.check()
        return target

    @property
    def spec(self) -> str:
        return self.module_name + (f":{self.impl}" if self.impl else "")

    def __str__(self) -> str:
        return self.spec

    @property
    def module(self):
        from .mutants import ensure_importable
        ensure_importable(self.module_name)
        return importlib.import_module(self.module_name)

    def check(self) -> None:
        module = self.module
        for name in ("gated_delta_rule", "gdn_decoupled_conv1d"):
            if not callable(getattr(module, name, None)):
                raise ValueError(f"target module {self.module_name!r} has no "
                                 f"callable {name} (docs/contract.md)")

    def _impl_kwargs(self) -> dict:
        return {"impl": self.impl} if self.impl else {}

    def gated_delta_rule(self, *args, **kwargs):
        return self.module.gated_delta_rule(*args, **kwargs, **self._impl_kwargs())

    def gdn_decoupled_conv1d(self, *args, **kwargs):
        return self.module.gdn_decoupled_conv1d(*args, **kwargs, **self._impl_kwargs())
