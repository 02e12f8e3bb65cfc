"""Both ops over a device mesh under jax.shard_map (docs/contract.md section 8).

    ops = gdn_kernels.sharded(mesh, batch_axis="data", head_axis="model")
    o, final_state = ops.gated_delta_rule(q, k, v, g, beta, impl="xla")

Every device holds whole batch rows and whole key-head groups (key heads
[j0, j1) with value heads [j0*G, j1*G)) and runs the unsharded kernels on its
shard, under shard_map's default check_vma=True (gdn_kernels.manual_axes).

Communication. The core op has none. The mixer reduces the gradients of the
parameters every batch shard shares (conv_weight, a_log/dt_bias without a
batch axis) over the batch axis, written out in `_shared_by_batch_shards`.
With a head axis its x-layout tensors (x, conv_weight, GDNState.conv) are
permuted so that each head shard's [q | k | v] channels are contiguous
(`channel_order`) and split by that axis; XLA moves them (and dx back) as the
layouts require.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import api
from .state import GDNState


def sharded(mesh, *, batch_axis=None, head_axis=None) -> "ShardedOps":
    """The two ops of the contract over `mesh`, the batch split by the mesh axis
    named batch_axis and the key-head groups by head_axis (None: not split)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh: expected a jax.sharding.Mesh, got {type(mesh).__name__}")
    for name, axis in (("batch_axis", batch_axis), ("head_axis", head_axis)):
        if axis is not None and axis not in mesh.axis_names:
            raise ValueError(f"{name}: {axis!r} is not an axis of the mesh "
                             f"(axes {tuple(mesh.axis_names)})")
    if batch_axis is not None and batch_axis == head_axis:
        raise ValueError(f"batch_axis and head_axis: both name mesh axis {batch_axis!r}")
    return ShardedOps(mesh, batch_axis, head_axis)


def channel_order(k_heads, v_heads, dk, dv, shards) -> np.ndarray:
    """Mixer channel indices [C] putting each head shard's [q | k | v] channels
    together: shard j takes key heads [j*Hk/n, (j+1)*Hk/n) of q and k and
    their value heads [j*Hv/n, (j+1)*Hv/n) of v."""
    hk, hv = k_heads // shards, v_heads // shards
    q0, k0, v0 = 0, k_heads * dk, 2 * k_heads * dk
    blocks = []
    for j in range(shards):
        blocks += [np.arange(q0 + j * hk * dk, q0 + (j + 1) * hk * dk),
                   np.arange(k0 + j * hk * dk, k0 + (j + 1) * hk * dk),
                   np.arange(v0 + j * hv * dv, v0 + (j + 1) * hv * dv)]
    return np.concatenate(blocks)


def _shared_by_batch_shards(axis):
    """Identity on a parameter every batch shard reads; its gradient is summed
    over the batch axis (the parameter varies over it from here on)."""
    @jax.custom_vjp
    def shared(p):
        return jax.lax.pcast(p, axis, to="varying")

    def fwd(p):
        return shared(p), None

    def bwd(_, dp):
        return (jax.lax.psum(dp, axis),)

    shared.defvjp(fwd, bwd)
    return shared


@dataclasses.dataclass(frozen=True)
class ShardedOps:
    """gated_delta_rule and gdn_decoupled_conv1d over `mesh` (see `sharded`)."""
    mesh: Mesh
    batch_axis: Optional[str]
    head_axis: Optional[str]

    def _size(self, axis) -> int:
        return 1 if axis is None else int(self.mesh.shape[axis])

    def _check_divides(self, argument, what, size, axis):
        shards = self._size(axis)
        if size % shards:
            raise ValueError(f"{argument}: {what} {size} is not divisible by mesh axis "
                             f"{axis!r} of size {shards}")

    def gated_delta_rule(self, *args, **kwargs):
        """docs/contract.md section 1 (and 6), per shard of the mesh: the
        signature and validation of gdn_kernels.gated_delta_rule."""
        a = api.call_arguments(api.gated_delta_rule, args, kwargs)
        q, k, v, g, beta, segment_ids = (a[n] for n in ("q", "k", "v", "g", "beta",
                                                        "segment_ids"))
        cfg, initial_state = api.prepared_delta_rule(**a)
        self._check_divides("q", "batch size", q.shape[0], self.batch_axis)
        self._check_divides("k", "number of key heads", k.shape[2], self.head_axis)
        fn = _sharded_delta_rule(self, cfg, segment_ids is not None)
        return fn(q, k, v, g, beta, initial_state, segment_ids)

    def gdn_decoupled_conv1d(self, *args, **kwargs):
        """docs/contract.md section 2 (and 6, 7), per shard of the mesh: the
        signature and validation of gdn_kernels.gdn_decoupled_conv1d."""
        call = api.call_arguments(api.gdn_decoupled_conv1d, args, kwargs)
        api.validated_mixer(**call)
        return self._mixer(**call)

    def _mixer(self, x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
               head_k_dim, head_v_dim, use_qk_norm, eps, scale, chunk_size, impl,
               segment_ids, state, return_state):
        """The validated mixer call over the mesh."""
        self._check_divides("x", "batch size", x.shape[0], self.batch_axis)
        self._check_divides("num_k_heads", "number of key heads", num_k_heads,
                            self.head_axis)
        shards = self._size(self.head_axis)
        cfg = api.mixer_config(num_k_heads // shards, num_v_heads // shards, head_k_dim,
                               head_v_dim, use_qk_norm, eps, scale, chunk_size, impl)
        state = (api.zero_mixer_state(x, conv_weight, num_v_heads, head_k_dim, head_v_dim)
                 if state is None else GDNState(*state))
        order = channel_order(num_k_heads, num_v_heads, head_k_dim, head_v_dim, shards)
        fn = _sharded_mixer(self, cfg, segment_ids is not None, a_log.shape, dt_bias.shape,
                            x.shape[0], tuple(order.tolist()))
        o, new_state = fn(x, conv_weight, a, b, a_log, dt_bias, segment_ids, state)
        return (o, new_state) if return_state else o

    # ---- layouts (section 8) ------------------------------------------------

    def heads_spec(self):
        """q, k, v, o: P(b, None, h, None)."""
        return P(self.batch_axis, None, self.head_axis, None)

    def gates_spec(self):
        """g, beta, a, b: P(b, None, h)."""
        return P(self.batch_axis, None, self.head_axis)

    def state_spec(self):
        """initial/final state, GDNState.recurrent: P(b, h, None, None)."""
        return P(self.batch_axis, self.head_axis, None, None)

    def ids_spec(self):
        """segment_ids: P(b, None)."""
        return P(self.batch_axis, None)

    def channels_spec(self):
        """x and GDNState.conv after channel_order: P(b, None, h)."""
        return P(self.batch_axis, None, self.head_axis)

    def gate_param_spec(self, shape, batch):
        """a_log / dt_bias: the head axis split by h; a batch axis of size B by b."""
        lead = [None] * (len(shape) - 1)
        if len(shape) > 1 and shape[0] == batch and batch > 1:
            lead[0] = self.batch_axis
        return P(*lead, self.head_axis)

    def place(self, x, spec):
        """x laid out as spec over the mesh (inside jit)."""
        sharding = NamedSharding(self.mesh, spec)
        if all(t == jax.sharding.AxisType.Explicit for t in self.mesh.axis_types):
            return jax.reshard(x, sharding)
        return jax.lax.with_sharding_constraint(x, sharding)

    def place_tree(self, x, spec):
        """`place` of an array, a GDNState (spec a GDNState of specs) or None."""
        if spec is None:
            return x
        if isinstance(x, GDNState):
            return GDNState(self.place(x.conv, spec.conv), self.place(x.recurrent, spec.recurrent))
        return self.place(x, spec)


def _map(ops: ShardedOps, body, in_specs, out_specs):
    """jax.shard_map over every axis of the mesh, check_vma left on."""
    return jax.shard_map(body, mesh=ops.mesh, in_specs=in_specs, out_specs=out_specs)


@functools.lru_cache(maxsize=None)
def _sharded_delta_rule(ops: ShardedOps, cfg, packed: bool):
    """jit of (q, k, v, g, beta, s0, ids) -> (o, final state) over the mesh."""
    kernel = api.jitted_delta_rule(cfg)
    heads, gates, state, ids = ops.heads_spec(), ops.gates_spec(), ops.state_spec(), \
        ops.ids_spec()
    in_specs = (heads, heads, heads, gates, gates, state, ids if packed else None)
    mapped = _map(ops, kernel, in_specs, (heads, state))

    def run(*args):
        return mapped(*(ops.place_tree(a, s) for a, s in zip(args, in_specs)))
    return jax.jit(run)


@functools.lru_cache(maxsize=None)
def _sharded_mixer(ops: ShardedOps, cfg, packed: bool, a_log_shape, dt_bias_shape, batch,
                   order):
    """jit of (x, w, a, b, a_log, dt_bias, ids, GDNState) -> (o, GDNState) over
    the mesh; order: channel_order of the head shards."""
    kernel = api.jitted_mixer(cfg)
    order = np.asarray(order)
    inverse = np.argsort(order)
    a_log_spec = ops.gate_param_spec(a_log_shape, batch)
    dt_bias_spec = ops.gate_param_spec(dt_bias_shape, batch)
    share = _shared_by_batch_shards(ops.batch_axis) if ops.batch_axis else (lambda p: p)

    def shared(p, spec):
        return p if ops.batch_axis in spec else share(p)

    def body(x, w, a, b, a_log, dt_bias, ids, state):
        w, a_log, dt_bias = share(w), shared(a_log, a_log_spec), shared(dt_bias, dt_bias_spec)
        return kernel(x, w, a, b, a_log, dt_bias, ids, state)

    chans = ops.channels_spec()
    state_specs = GDNState(chans, ops.state_spec())
    in_specs = (chans, P(None, ops.head_axis), ops.gates_spec(), ops.gates_spec(), a_log_spec,
                dt_bias_spec, ops.ids_spec() if packed else None, state_specs)
    mapped = _map(ops, body, in_specs, (ops.heads_spec(), state_specs))

    def permute(y, index, whole, split):
        """y's channels (last axis) in the order index, laid out as `whole`
        (channels unsplit) before the permutation and as `split` after
        (nothing to permute when the heads are not split)."""
        if ops.head_axis is None:
            return ops.place(y, split)
        return ops.place(ops.place(y, whole)[..., index], split)

    rows, rows_split = P(ops.batch_axis, None, None), ops.channels_spec()

    def run(x, w, a, b, a_log, dt_bias, ids, state):
        state = GDNState(permute(state.conv, order, rows, rows_split),
                         ops.place(state.recurrent, ops.state_spec()))
        x, w = permute(x, order, rows, rows_split), permute(w, order, P(), P(None, ops.head_axis))
        rest = (ops.place_tree(u, s) for u, s in zip((a, b, a_log, dt_bias, ids), in_specs[2:]))
        o, new_state = mapped(x, w, *rest, state)
        conv = permute(new_state.conv, inverse, rows, rows)
        return o, GDNState(conv, new_state.recurrent)
    return jax.jit(run)
