"""Device meshes (docs/contract.md section 8): the meshes a sharding property
runs a case on, and a case tiled so its batch and key heads divide by the
shards. The mesh is derived from the case's seed, so a stored counterexample
replays on the same mesh."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from .cases import DeltaRuleCase, MixerCase, replace

MESH_DEVICES = 8


@dataclasses.dataclass(frozen=True)
class MeshKind:
    """A mesh over MESH_DEVICES devices: axes (name, size) and which of its
    axes splits the batch and which the key-head groups (None: not split)."""
    name: str
    axes: Tuple[Tuple[str, int], ...]
    batch_axis: Optional[str]
    head_axis: Optional[str]

    @property
    def shards(self) -> Tuple[int, int]:
        """(batch shards, head shards)."""
        sizes = dict(self.axes)
        return sizes.get(self.batch_axis, 1), sizes.get(self.head_axis, 1)


def _two_axes(data: int, model: int, batch=True, heads=True) -> MeshKind:
    name = f"({data},{model})" + ("" if batch and heads else
                                   " batch-only" if batch else " heads-only")
    return MeshKind(name, (("data", data), ("model", model)),
                    "data" if batch else None, "model" if heads else None)


# (8,1), (4,2), (2,4), (1,8); then one axis left out of the split on a 2-axis
# mesh (every activation of a correct shard_map stays local to that axis).
MESH_KINDS = (_two_axes(8, 1), _two_axes(4, 2), _two_axes(2, 4), _two_axes(1, 8),
              _two_axes(4, 2, heads=False), _two_axes(2, 4, batch=False))


def mesh_kind(case) -> MeshKind:
    return MESH_KINDS[case.seed % len(MESH_KINDS)]


def param_has_batch_axis(shape, batch: int) -> bool:
    """An a_log/dt_bias shape with a batch axis of size B > 1 (split and tiled
    with the rows; a leading axis of size 1 broadcasts)."""
    return len(shape) > 1 and shape[0] == batch and batch > 1


def _tile_param_shape(shape, batch, batch_shards, head_shards):
    """An a_log/dt_bias shape of the tiled case: a batch axis of size B > 1
    grows with the batch; the head axis with the heads."""
    shape = list(shape)
    if param_has_batch_axis(shape, batch):
        shape[0] *= batch_shards
    shape[-1] *= head_shards
    return tuple(shape)


def shard_param_shape(shape, batch: int, batch_shards: int, head_shards: int):
    """One shard's block of an a_log/dt_bias shape (inverse of the tiling)."""
    shape = list(shape)
    if param_has_batch_axis(shape, batch):
        shape[0] //= batch_shards
    shape[-1] //= head_shards
    return tuple(shape)


def fit_case(case, batch_shards: int, head_shards: int):
    """The case with B times batch_shards rows (the packed layout repeated) and
    Hk times head_shards key heads (G, Dk, Dv kept); inputs are drawn anew
    from the same seed for the larger shapes."""
    if batch_shards == head_shards == 1:
        return case
    changes = dict(batch=case.batch * batch_shards, k_heads=case.k_heads * head_shards,
                   segments=tuple(case.segments) * batch_shards if case.segments else ())
    if isinstance(case, MixerCase):
        changes.update(
            a_log_shape=_tile_param_shape(case.a_log_shape, case.batch, batch_shards,
                                           head_shards),
            dt_bias_shape=_tile_param_shape(case.dt_bias_shape, case.batch, batch_shards,
                                             head_shards))
    elif not isinstance(case, DeltaRuleCase):
        raise TypeError(f"fit_case: not a case: {type(case).__name__}")
    return replace(case, **changes)
