"""The targets: what is verified and how it is called.

    declaration.py   KernelDeclaration, Supports, Limits: what a target
                     implements, accepts and takes
    adapters.py      verification.adapt / mixer_from_core: a kernel in other
                     conventions wrapped to the contract
    layer_adapter.py verification.adapt_mixer: a whole layer in its own
                     conventions wrapped to the contract's mixer
    varlen.py        the cu_seqlens convention (contract rows <-> packed tokens)
    bridge.py        a kernel of another framework made a JAX function
                     (callbacks, 64-bit values, its own VJP); torch_bridge.py
                     (verification.from_torch) and mlx_bridge.py (from_mlx)
    (here)           Target: the implementation under test, parsed from
                     MODULE[:IMPL][@AXIS=N,...]

MODULE exports a KernelDeclaration (verification/targets/declaration.py) or defines
the contract's functions (at least one of gated_delta_rule and
gdn_decoupled_conv1d: a layer-only target). With ":IMPL" the
suite passes impl=IMPL; without it, nothing (the module's own default). With
"@data=4,model=2" the target is MODULE.sharded over a mesh of those axes
(docs/contract.md section 8): the axis named `data` splits the batch, the
axis named `model` the key-head groups; each case is first tiled to the
mesh (strategies.mesh.fit_case). Chosen by --gdn-target or the GDN_TARGET
environment variable.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import os
import sys
from typing import Optional, Tuple

from .declaration import KernelDeclaration, declaration_of, unmet

ENV_VAR = "GDN_TARGET"
DEFAULT_TARGET = "gdn_kernels:pallas"
# Targets whose module is this repository's kernels (or a mutant of them):
# the repository's self-tests run by default only for these.
OUR_MODULES = ("gdn_kernels",)
# The mesh axis names a target spec may use, and what each splits.
BATCH_AXIS, HEAD_AXIS = "data", "model"


def lattice_knob_values(declaration) -> dict:
    """{lattice knob: the values the target takes} read off its declared
    supports, where they leave some out: a QK norm fixed inside its layer
    (qk_norm on only), its activation dtypes, no GVA (group 1 layouts), its
    chunk sizes, no initial state of the core op, no scale= (the default
    only)."""
    from strategies import lattice
    s, values = declaration.supports, {}
    if s.mixer_qk_norm is not None:
        values["qk_norm"] = (True,)
    if set(s.dtypes) != {pair[0] for pair in lattice.DTYPE_PAIRS}:
        values["dtypes"] = tuple(p for p in lattice.DTYPE_PAIRS if p[0] in s.dtypes)
    if not s.gva:
        values["layout"] = tuple(layout for layout in lattice.HEAD_LAYOUTS if layout[1] == 1)
    if s.chunk_sizes is not None:
        values["chunk"] = tuple(s.chunk_sizes)
    if not s.initial_state:
        values["initial_state"] = (False,)
    if not s.scale:
        values["scale"] = (1.0,)
    return values


def declare_to_lattice(declaration) -> None:
    """Build the session's shape lattice (strategies.lattice) inside what the
    target takes: its chunk sizes beyond the contract, its declared shape
    limits and the knob values of its supports (lattice_knob_values). A
    coverage claim is then met by a case the target takes wherever one
    exists, not lost with a lattice row it refuses."""
    from strategies import lattice
    lattice.declare_beyond_contract(declaration.supports.chunk_sizes)
    lattice.declare_limits(declaration.limits if declaration.limits.declared else None)
    lattice.declare_knob_values(lattice_knob_values(declaration))


def make_importable(directory: str) -> None:
    """directory on sys.path (first), unless it is there already: a target
    module in it imports, as under `python -m pytest`."""
    if os.path.abspath(directory) not in map(os.path.abspath, sys.path):
        sys.path.insert(0, directory)


class TargetError(ValueError):
    """A target spec that cannot be imported or resolved."""


def parse_mesh(text: str) -> Tuple[Tuple[str, int], ...]:
    """"data=4,model=2" -> (("data", 4), ("model", 2)) (ValueError if malformed)."""
    axes = []
    for part in text.split(","):
        name, _, size = part.partition("=")
        name = name.strip()
        if name not in (BATCH_AXIS, HEAD_AXIS) or not size.strip().isdigit() \
                or int(size) < 1 or name in dict(axes):
            raise ValueError(f"target mesh {text!r}: expected {BATCH_AXIS}=N and/or "
                             f"{HEAD_AXIS}=N (each once, N >= 1)")
        axes.append((name, int(size)))
    return tuple(axes)


@dataclasses.dataclass(frozen=True)
class Target:
    """A module implementing docs/contract.md, plus an optional impl= value."""
    module_name: str
    impl: Optional[str] = None
    mesh_axes: Tuple[Tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, spec: Optional[str] = None) -> "Target":
        """The target of a spec (default: GDN_TARGET, else DEFAULT_TARGET);
        TargetError naming the spec and the reason when it cannot be
        imported or resolved."""
        spec = spec or os.environ.get(ENV_VAR) or DEFAULT_TARGET
        text, _, mesh = spec.partition("@")
        module_name, _, impl = text.partition(":")
        if not module_name.strip():
            raise TargetError(f"target {spec!r}: no module name (expected MODULE[:IMPL])")
        try:
            target = cls(module_name=module_name.strip(), impl=impl.strip() or None,
                         mesh_axes=parse_mesh(mesh) if mesh else ())
            target.check()
        except TargetError:
            raise
        except ImportError as err:
            raise TargetError(f"target {spec!r}: cannot import {module_name.strip()!r}: "
                              f"{type(err).__name__}: {err}") from None
        except (ValueError, TypeError) as err:
            raise TargetError(f"target {spec!r}: {err}") from None
        return target

    @property
    def spec(self) -> str:
        mesh = ",".join(f"{n}={s}" for n, s in self.mesh_axes)
        return (self.module_name + (f":{self.impl}" if self.impl else "")
                + (f"@{mesh}" if mesh else ""))

    @property
    def devices(self) -> int:
        """Devices the target needs (1 unless sharded)."""
        return math.prod(s for _, s in self.mesh_axes)

    @property
    def shards(self) -> Tuple[int, int]:
        """(batch shards, head shards) of a sharded target; (1, 1) otherwise."""
        axes = dict(self.mesh_axes)
        return axes.get(BATCH_AXIS, 1), axes.get(HEAD_AXIS, 1)

    @property
    def unsharded(self) -> "Target":
        """The same module and impl on one device."""
        return dataclasses.replace(self, mesh_axes=())

    def fit(self, case):
        """The case tiled to the mesh (batch and key heads times the shards)."""
        if not self.mesh_axes:
            return case
        from strategies.mesh import fit_case
        return fit_case(case, *self.shards)

    def __str__(self) -> str:
        return self.spec

    @property
    def module(self):
        return _import(self.module_name)

    @property
    def declaration(self) -> KernelDeclaration:
        """What the module declares (or what it defines, read as a declaration)."""
        return _declaration(self.module_name)

    @property
    def is_ours(self) -> bool:
        """This repository's kernels, or a seeded-bug mutant of them."""
        from ..mutants import PREFIX
        return self.module_name in OUR_MODULES or self.module_name.startswith(PREFIX)

    def check(self) -> None:
        declaration = self.declaration
        if self.mesh_axes and declaration.sharded is None:
            raise ValueError(f"a mesh target needs sharded(), which "
                             f"{self.module_name!r} does not declare (contract section 8)")

    def not_checkable(self, needs) -> Optional[str]:
        """Why a check with these needs (registry.Property.not_checkable
        gathers a property's and a case's) cannot be made on this target,
        or None when it can."""
        return unmet(self.declaration, tuple(needs))

    def impl_kwargs(self) -> dict:
        return {"impl": self.impl} if self.impl else {}

    @property
    def ops(self):
        """What the two ops are called on: the declared functions, or their
        sharded versions over the target's mesh."""
        if not self.mesh_axes:
            return self.declaration
        axes = dict(self.mesh_axes)
        return sharded_ops(self.unsharded, self.mesh_axes,
                           BATCH_AXIS if BATCH_AXIS in axes else None,
                           HEAD_AXIS if HEAD_AXIS in axes else None)

    def gated_delta_rule(self, *args, **kwargs):
        return self.ops.gated_delta_rule(*args, **kwargs, **self.impl_kwargs())

    def gdn_decoupled_conv1d(self, *args, **kwargs):
        return self.ops.gdn_decoupled_conv1d(*args, **kwargs, **self.impl_kwargs())


def make_mesh(axes: Tuple[Tuple[str, int], ...]):
    """A jax Mesh of these (name, size) axes (Auto axis types) over the first
    devices; ValueError saying how to get more CPU devices if too few."""
    import jax
    needed = math.prod(s for _, s in axes)
    if jax.device_count() < needed:
        raise ValueError(f"a mesh {dict(axes)} needs {needed} devices, this process has "
                         f"{jax.device_count()}: set XLA_FLAGS=--xla_force_host_platform_"
                         f"device_count={needed} before jax is imported")
    return jax.make_mesh(tuple(s for _, s in axes), tuple(n for n, _ in axes),
                         axis_types=(jax.sharding.AxisType.Auto,) * len(axes),
                         devices=jax.devices()[:needed])


@functools.lru_cache(maxsize=None)
def sharded_ops(target: "Target", axes, batch_axis, head_axis):
    """The (unsharded) target's module.sharded over a mesh of these axes, the
    batch split by batch_axis and the key-head groups by head_axis (None:
    not split); built once per combination."""
    return target.declaration.sharded(make_mesh(axes), batch_axis=batch_axis,
                                      head_axis=head_axis)


def _import(module_name: str):
    """The target's module (a seeded-bug mutant is materialised first)."""
    from ..mutants import ensure_importable
    ensure_importable(module_name)
    return importlib.import_module(module_name)


@functools.lru_cache(maxsize=None)
def _declaration(module_name: str) -> KernelDeclaration:
    return declaration_of(_import(module_name))
