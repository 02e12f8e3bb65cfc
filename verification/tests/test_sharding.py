"""The pieces behind the sharding family that need no mesh: sharded target
specs, cases tiled to a mesh, the mixer's head-shard channel order, and the
reading of collectives from compiled HLO (kinds, shapes, replica groups and
the mesh axes those span). (The family's properties run in a
mesh worker: verification/engine/mesh_worker.py.)"""

import numpy as np
import pytest

from gdn_kernels.sharded import channel_order
from strategies.explicit import delta_case, mixer_case
from strategies.mesh import MESH_DEVICES, MESH_KINDS, fit_case
from strategies.shapes import HeadLayout

from ..properties.sharding import (Collective, allowed_collectives, collectives,
                                  communication_fault, moved_axes)
from ..targets import Target


def test_sharded_target_spec_round_trips():
    target = Target.parse("gdn_kernels:pallas@data=4,model=2")
    assert target.spec == "gdn_kernels:pallas@data=4,model=2"
    assert (target.devices, target.shards) == (8, (4, 2))
    assert target.unsharded.spec == "gdn_kernels:pallas"
    assert Target.parse("gdn_kernels:xla@model=2").shards == (1, 2)


@pytest.mark.parametrize("spec", ["gdn_kernels:xla@rows=2", "gdn_kernels:xla@data=0",
                                  "gdn_kernels:xla@data=2,data=2", "gdn_kernels:xla@data"])
def test_malformed_mesh_spec_is_refused(spec):
    with pytest.raises(ValueError, match="target mesh"):
        Target.parse(spec)


def test_every_mesh_kind_uses_all_devices():
    for kind in MESH_KINDS:
        assert np.prod([s for _, s in kind.axes]) == MESH_DEVICES, kind.name


def test_mesh_kinds_include_a_mesh_axis_that_splits_nothing_each_way():
    """The communication property sees a mesh whose data axis splits nothing
    and one whose model axis splits nothing."""
    sizes = [dict(kind.axes) for kind in MESH_KINDS]
    assert any(k.batch_axis is None and s["data"] > 1 for k, s in zip(MESH_KINDS, sizes))
    assert any(k.head_axis is None and s["model"] > 1 for k, s in zip(MESH_KINDS, sizes))


def test_fit_case_tiles_batch_heads_and_parameters():
    case = mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=1, param_rank=2)
    fitted = fit_case(case, 4, 2)
    assert (fitted.batch, fitted.k_heads, fitted.group) == (8, 4, 2)
    assert fitted.a_log_shape == (8, 8) and fitted.dt_bias_shape == (8, 8)
    packed = delta_case("gva4", 2, 17, 16, seed=5, segments=(((1, 17),), ((2, 9), (0, 8))))
    assert fit_case(packed, 2, 1).segments == packed.segments * 2
    assert fit_case(packed, 1, 1) is packed


def test_channel_order_keeps_each_key_head_with_its_value_heads():
    lay = HeadLayout(4, 2, 3, 5)                # Hk=4, G=2, Dk=3, Dv=5
    order = channel_order(lay.k_heads, lay.v_heads, lay.dk, lay.dv, 2)
    assert sorted(order.tolist()) == list(range(lay.channels))
    first = order[:lay.channels // 2]          # head shard 0: key heads 0, 1
    q, k, v = first[:6], first[6:12], first[12:]
    assert q.tolist() == list(range(0, 6)) and k.tolist() == list(range(12, 18))
    assert v.tolist() == list(range(24, 24 + 4 * 5))    # value heads 0..3


HLO = """
  %all-reduce.11 = f32[2,3,384]{2,1,0} all-reduce(%x), channel_id=21, replica_groups=[4,2]<=[8]
  %all-reduce.15 = (f32[4,192]{1,0}, f32[8]{0}) all-reduce(%a, %b), channel_id=1
  %ag = bf16[8,40,96]{2,1,0} all-gather-start(%c), replica_groups={{0,4},{1,5},{2,6},{3,7}}
  %fusion = f32[2,40,384]{2,1,0} fusion(%all-reduce.11), kind=kLoop
  %cp = f32[16,32]{1,0} collective-permute(%d), source_target_pairs={{0,0},{2,4},{4,2}}
  %a2a = (f32[1,16]{1,0}, f32[1,16]{1,0}) all-to-all(%e, %f), replica_groups=[4,2]<=[2,4]T(1,0)
"""


def test_collectives_are_read_from_hlo_with_their_shapes_and_groups():
    assert collectives(HLO) == [
        Collective("all-reduce", ((2, 3, 384),), ((0, 1), (2, 3), (4, 5), (6, 7))),
        Collective("all-reduce", ((4, 192), (8,)), (tuple(range(8)),)),
        Collective("all-gather", ((8, 40, 96),), ((0, 4), (1, 5), (2, 6), (3, 7))),
        Collective("collective-permute", ((16, 32),), ((0, 0), (2, 4), (4, 2))),
        Collective("all-to-all", ((1, 16), (1, 16)), ((0, 4), (1, 5), (2, 6), (3, 7)))]


# XLA's mesh form of replica groups (written by the SPMD partitioner): the
# device ids laid out on a mesh of its own axes, grouped along the axes (or
# sub-axes `'axis':(pre-size)size`) in braces.
MESH_FORM = {
    "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}":
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    "mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}": ((0, 4), (1, 5), (2, 6), (3, 7)),
    "mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}": (tuple(range(8)),),
    "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}":
        ((0, 1), (2, 3), (4, 5), (6, 7)),
    "mesh['axis_0'=8] {'axis_0':(1)2}": ((0, 4), (1, 5), (2, 6), (3, 7)),
}


@pytest.mark.parametrize("groups", sorted(MESH_FORM))
def test_mesh_form_replica_groups_are_read(groups):
    line = f"  %ar = f32[2,33,384]{{2,1,0}} all-reduce(%x), replica_groups={groups}\n"
    found = collectives(line)
    assert [sorted(map(sorted, c.groups)) for c in found] == [sorted(map(sorted,
                                                                   MESH_FORM[groups]))]


def test_unknown_group_form_is_unreadable_not_ignored():
    line = "  %ar = f32[8]{0} all-reduce(%x), replica_groups=somewhere{0..7}\n"
    assert collectives(line)[0].groups is None


def test_moved_axes_are_the_mesh_axes_a_group_spans():
    axes = (("data", 2), ("model", 4))        # device d at (d // 4, d % 4)
    assert moved_axes(((0, 1, 2, 3), (4, 5, 6, 7)), axes) == {"model"}
    assert moved_axes(((0, 4), (1, 5), (2, 6), (3, 7)), axes) == {"data"}
    assert moved_axes((tuple(range(8)),), axes) == {"data", "model"}
    assert moved_axes(((0, 0), (1, 5)), axes) == {"data"}      # permute pairs
    assert moved_axes(((3,),), axes) == frozenset()


def test_heads_only_dx_gather_may_move_along_the_head_axis_only():
    """The review's case: the mixer's dx [B, T, C] (with d conv_weight and the
    conv state's cotangent) all-reduced over the head axis is allowed; the
    same all-reduce over both axes moves data along the unused data axis."""
    kind = next(k for k in MESH_KINDS if k.name == "(2,4) heads-only")
    case = fit_case(mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=5, param_rank=1),
                    *kind.shards)
    allowed = allowed_collectives(case, kind)
    shapes = "(f32[2,33,384]{2,1,0}, f32[4,384]{1,0}, f32[2,3,384]{2,1,0})"
    heads = ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) "
             "{'axis_0'}")
    for groups, fault in ((heads, None), ("{{0,1,2,3,4,5,6,7}}", "over axes ['data', 'model']"),
                          ("{{0,4},{1,5},{2,6},{3,7}}", "over axes ['data']")):
        line = f"  %ar = {shapes} all-reduce(%a, %b, %c), replica_groups={groups}\n"
        found = communication_fault(collectives(line)[0], allowed, kind)
        assert (found is None) if fault is None else (fault in found), (groups, found)


def test_batch_only_shared_gradients_may_move_along_the_batch_axis_only():
    """On (4, 2) batch-only (model splits nothing) the shared parameters'
    gradients are all-reduced along data only, and no x-layout tensor moves."""
    kind = next(k for k in MESH_KINDS if k.name == "(4,2) batch-only")
    case = fit_case(mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=4, param_rank=1),
                    *kind.shards)
    allowed = allowed_collectives(case, kind)
    line = ("  %ar = (f32[4,96]{1,0}, f32[4]{0}, f32[4]{0}) all-reduce(%a, %b, %c), "
            "replica_groups=GROUPS\n")
    data = line.replace("GROUPS", "{{0,2,4,6},{1,3,5,7}}")
    both = line.replace("GROUPS", "[1,8]<=[8]")
    assert communication_fault(collectives(data)[0], allowed, kind) is None
    assert "over axes ['data', 'model']" in communication_fault(collectives(both)[0],
                                                                 allowed, kind)
    dx = "  %ag = f32[8,33,96]{2,1,0} all-gather(%x), replica_groups={{0,2,4,6},{1,3,5,7}}\n"
    assert "no tensor" in communication_fault(collectives(dx)[0], allowed, kind)
