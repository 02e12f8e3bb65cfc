"""The pieces behind the sharding family that need no mesh: sharded target
specs, cases tiled to a mesh, the mixer's head-shard channel order, and the
reading of collectives from compiled HLO. (The family's properties run in a
mesh worker: verification/mesh_worker.py.)"""

import numpy as np
import pytest

from gdn_kernels.sharded import channel_order
from strategies.explicit import delta_case, mixer_case
from strategies.mesh import MESH_DEVICES, MESH_KINDS, fit_case
from strategies.shapes import HeadLayout

from .properties.sharding import collectives
from .targets import Target


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
  %ag = bf16[8,40,96]{2,1,0} all-gather-start(%c), dimensions={0}
  %fusion = f32[2,40,384]{2,1,0} fusion(%all-reduce.11), kind=kLoop
"""


def test_collectives_are_read_from_hlo_with_their_shapes():
    assert collectives(HLO) == [("all-reduce", ((2, 3, 384),)),
                                ("all-reduce", ((4, 192), (8,))),
                                ("all-gather", ((8, 40, 96),))]
