"""Sharding over a device mesh (docs/contract.md section 8): the target's
module `sharded(mesh, batch_axis=..., head_axis=...)` gives the one-device
results, each shard computes what the one-device op computes on its rows
and heads alone, and the compiled program communicates only as the
contract allows. Each case runs on one mesh of 8 devices (strategies.mesh,
derived from the seed), tiled so its batch and key heads divide; in a
process with fewer devices the checks run in a mesh worker.

The oracle of these properties is the same module on one device: what they
add is that sharding changes nothing. The declared subset of the other
families (on_sharded_target) runs against a sharded target and compares it
with the float64 oracle.

Every comparison uses the contract's bound (tolerance `sharded`, float32
1e-6 relative), also a shard's results against the one-device op on that
shard alone: gdn_kernels measured bitwise there (ratio 0.00), but the
contract promises summation-order error only, and a correct implementation
that is not ours may fuse a shard's program differently.
A target module without `sharded` (section 8 not implemented) gets one
row "not checkable", counted in the summary.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Dict, List, Optional, Tuple

import numpy as np
from hypothesis import strategies as st

from gdn_kernels import GDNState
from strategies import delta_rule_cases, mixer_cases
from strategies.cases import DeltaRuleCase, MixerCase, replace
from strategies.explicit import delta_case, mixer_case
from strategies.mesh import (MESH_DEVICES, MESH_KINDS, MeshKind, fit_case, mesh_kind,
                             param_has_batch_axis, shard_param_shape)
from strategies.state import incoming_state, pieces

from ..engine import runners
from ..engine.registry import prop
from ..targets import Target, make_mesh, sharded_ops
from ..tolerance import TensorError, compare_sharded, structural_row
from .common import CORE_OP, PACKED, names_argument
from .state import tensor_dtype


@dataclasses.dataclass(frozen=True)
class MeshTarget:
    """A target's module sharded over one MeshKind: the two ops, as a target."""
    base: Target
    kind: MeshKind

    @property
    def spec(self) -> str:
        return f"{self.base.spec} over {self.kind.name}"

    @property
    def ops(self):
        return sharded_ops(self.base, self.kind.axes, self.kind.batch_axis, self.kind.head_axis)

    def gated_delta_rule(self, *args, **kwargs):
        return self.ops.gated_delta_rule(*args, **kwargs, **self.base.impl_kwargs())

    def gdn_decoupled_conv1d(self, *args, **kwargs):
        return self.ops.gdn_decoupled_conv1d(*args, **kwargs, **self.base.impl_kwargs())


def _on_mesh(target: Target, case):
    """(the case tiled to its mesh, the target's module over that mesh, the
    module on one device)."""
    kind = mesh_kind(case)
    return fit_case(case, *kind.shards), MeshTarget(target.unsharded, kind), target.unsharded


# ------------------------------------------------------------ one shard alone

def _shard_blocks(case, kind: MeshKind, shard: Tuple[int, int]):
    """(rows, key heads, value heads) of shard (i, j) as slices."""
    nb, nh = kind.shards
    i, j = shard
    rb, hk, hv = case.batch // nb, case.k_heads // nh, case.v_heads // nh
    return slice(i * rb, (i + 1) * rb), slice(j * hk, (j + 1) * hk), slice(j * hv, (j + 1) * hv)


def _shard_case(case, kind: MeshKind, shard):
    """The case of one shard's rows and key-head groups."""
    nb, nh = kind.shards
    rows = _shard_blocks(case, kind, shard)[0]
    changes = dict(batch=case.batch // nb, k_heads=case.k_heads // nh,
                   segments=tuple(case.segments[rows]) if case.segments else ())
    if isinstance(case, MixerCase):
        changes.update(a_log_shape=shard_param_shape(case.a_log_shape, case.batch, nb, nh),
                       dt_bias_shape=shard_param_shape(case.dt_bias_shape, case.batch, nb,
                                                       nh))
    return replace(case, **changes)


def _channels(case: MixerCase, kind: MeshKind, j: int) -> np.ndarray:
    """The mixer channels ([q | k | v] of x) of head shard j."""
    nh = kind.shards[1]
    hk, hv, dk, dv = case.k_heads // nh, case.v_heads // nh, case.dk, case.dv
    q0, k0, v0 = 0, case.k_heads * dk, 2 * case.k_heads * dk
    return np.concatenate([np.arange(q0 + j * hk * dk, q0 + (j + 1) * hk * dk),
                           np.arange(k0 + j * hk * dk, k0 + (j + 1) * hk * dk),
                           np.arange(v0 + j * hv * dv, v0 + (j + 1) * hv * dv)])


def _delta_block(name, x, case, kind, shard):
    """Shard's block of a gated_delta_rule tensor (inputs, outputs, cotangents)."""
    rows, hk, hv = _shard_blocks(case, kind, shard)
    heads = hk if name in ("q", "k") else hv
    if name in ("initial_state", "final_state"):
        return x[rows, heads]
    return x[rows, :, heads]


def _mixer_block(name, x, case, kind, shard):
    """Shard's block of a mixer tensor."""
    rows, _, hv = _shard_blocks(case, kind, shard)
    chans = _channels(case, kind, shard[1])
    if name in ("x", "conv"):
        return x[rows][..., chans]
    if name == "conv_weight":
        return x[:, chans]
    if name in ("a_log", "dt_bias"):
        lead = rows if param_has_batch_axis(x.shape, case.batch) else slice(None)
        return x[lead][..., hv] if x.ndim > 1 else x[hv]
    if name == "recurrent":
        return x[rows, hv]
    return x[rows][:, :, hv]      # a, b [B, T, Hv]; o [B, T, Hv, Dv]


def _corner_shards(kind: MeshKind):
    """The first and the last shard (every shard runs the same program)."""
    nb, nh = kind.shards
    return sorted({(0, 0), (nb - 1, nh - 1)})


# ------------------------------------------------------------ the core op

def _delta_rows(target: Target, case: DeltaRuleCase) -> List[TensorError]:
    case, on_mesh, one = _on_mesh(target, case)
    kind = on_mesh.kind
    inputs = runners.case_inputs(case)
    cts = tuple(c.astype(np.float32) for c in runners.cotangents(case))
    m_out, m_grads = runners.run_vjp(runners.target_fn(on_mesh, "delta"), case, inputs, cts)
    u_out, u_grads = runners.run_vjp(runners.target_fn(one, "delta"), case, inputs, cts)
    names = runners.output_names(case)
    rows = [compare_sharded(f"{n} (mesh vs one device)", m, u, tensor_dtype(case, n))
            for n, m, u in zip(names, m_out, u_out)]
    rows += [compare_sharded(f"d{n} (mesh vs one device)", m_grads[n], u_grads[n],
                             tensor_dtype(case, n)) for n in inputs]
    for shard in _corner_shards(kind):
        sub = _shard_case(case, kind, shard)
        block = functools.partial(_delta_block, case=case, kind=kind, shard=shard)
        s_out, s_grads = runners.run_vjp(
            runners.target_fn(one, "delta"), sub,
            {n: block(n, v) for n, v in inputs.items()},
            tuple(block(n, c) for n, c in zip(names, cts)))
        rows += [compare_sharded(f"{n} shard {shard} vs alone", block(n, m), s,
                                 tensor_dtype(case, n)) for n, m, s in zip(names, m_out, s_out)]
        rows += [compare_sharded(f"d{n} shard {shard} vs alone", block(n, m_grads[n]),
                                 s_grads[n], tensor_dtype(case, n)) for n in inputs]
    return rows


MESH_COVERS = {kind.name: (lambda c, kind=kind: mesh_kind(c) == kind) for kind in MESH_KINDS}
# The mesh layouts are the gate's claims on the two equality properties: each
# is a program of its own in the mesh worker (measured: 4 claim cases took the
# dev main job from 3 to 7 examples and 12 to 70 CPU seconds on these two);
# the dev loop checks the layouts of its explicit and drawn examples.
MESH_LAYOUTS_GATE_ONLY = ("gate-only: each mesh layout is a program of its own in the mesh "
                          "worker; the dev loop checks the layouts its examples draw, the "
                          "ci, kill and nightly profiles every layout")
HEAD_SPLIT_GVA = {"GVA heads split": lambda c: c.group > 1 and mesh_kind(c).shards[1] > 1}

# GVA (G = 2, two key heads) on the (4, 2) mesh (seed % 6 == 1) and G = 4 on
# the (2, 4) heads-only mesh (seed % 6 == 5): the head split must keep each
# key head's value heads with it.
DELTA_GVA_SPLIT = (delta_case("gva2-2keys-dk<dv", 1, 33, 16, seed=1),
                   delta_case("gva4", 2, 17, 16, seed=5))
MIXER_GVA_SPLIT = (mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=1, param_rank=2),
                   mixer_case("gva4", 2, 17, 16, seed=5, param_rank=1))


@prop("sharded_delta_rule_equals_one_device", family="sharding",
      strategy=st.one_of(delta_rule_cases(), delta_rule_cases(packed=True)),
      wrong_target="gdn_mutant_sharded_initial_state_ignored:xla", weight=0.1,
      devices=MESH_DEVICES, needs=("sharded",), examples=DELTA_GVA_SPLIT,
      covers={**HEAD_SPLIT_GVA, "packed": PACKED},
      gate_covers=MESH_COVERS, gate_only_why=MESH_LAYOUTS_GATE_ONLY)
def sharded_delta_rule_equals_one_device(target, case: DeltaRuleCase):
    """gated_delta_rule over a mesh of 8 devices equals the one-device op
    (outputs, final state, every cotangent) within summation-order error,
    and so do each corner shard's outputs and cotangents against the
    one-device op run on that shard's rows and key-head groups alone."""
    return _delta_rows(target, case)


# ------------------------------------------------------------ the mixer

def _mixer_rows(target: Target, case: MixerCase) -> List[TensorError]:
    case, on_mesh, one = _on_mesh(target, case)
    kind = on_mesh.kind
    inputs, state = runners.case_inputs(case), incoming_state(case)
    whole = pieces(case, "one")
    m_out, m_grads = runners.run_pieces(runners.target_fn(on_mesh, "mixer"), case, inputs,
                                        state, whole)
    u_out, u_grads = runners.run_pieces(runners.target_fn(one, "mixer"), case, inputs, state,
                                        whole)
    rows = [compare_sharded(f"{n} (mesh vs one device)", m_out[n], u_out[n],
                            tensor_dtype(case, n)) for n in m_out]
    rows += [compare_sharded(f"d{n} (mesh vs one device)", m_grads[n], u_grads[n],
                             tensor_dtype(case, "d" + n)) for n in m_grads]
    for shard in _corner_shards(kind):
        rows += _mixer_shard_rows(one, case, kind, shard, inputs, state, m_out)
    return rows


def _mixer_shard_rows(one: Target, case, kind, shard, inputs, state, m_out):
    """A shard's outputs and returned state vs the one-device mixer on its
    rows, channels and heads alone."""
    sub = _shard_case(case, kind, shard)
    block = functools.partial(_mixer_block, case=case, kind=kind, shard=shard)
    args = {n: block(n, v) for n, v in inputs.items()}
    ids = runners.segment_ids_of(sub)
    o, new_state = one.gdn_decoupled_conv1d(
        *(args[n] for n in runners.MIXER_INPUTS),
        state=GDNState(block("conv", state["conv"]), block("recurrent", state["recurrent"])),
        return_state=True, **({} if ids is None else {"segment_ids": ids}),
        **dict(runners.mixer_static(sub)))
    alone = {"o": o, "conv": new_state.conv, "recurrent": new_state.recurrent}
    return [compare_sharded(f"{n} shard {shard} vs alone", block(n, m_out[n]),
                            np.asarray(alone[n]), tensor_dtype(case, n)) for n in alone]


@prop("sharded_mixer_equals_one_device", family="sharding",
      strategy=st.one_of(mixer_cases(), mixer_cases(packed=True)),
      wrong_target="gdn_mutant_sharded_value_heads_by_key_index:xla", weight=0.1,
      devices=MESH_DEVICES, needs=("sharded", "carried_state", "incoming_conv_state"),
      examples=MIXER_GVA_SPLIT,
      covers={**HEAD_SPLIT_GVA, "packed": PACKED,
              "a_log with a batch axis": lambda c: param_has_batch_axis(c.a_log_shape,
                                                                        c.batch)},
      gate_covers=MESH_COVERS, gate_only_why=MESH_LAYOUTS_GATE_ONLY)
def sharded_mixer_equals_one_device(target, case: MixerCase):
    """gdn_decoupled_conv1d over a mesh of 8 devices, from a carried
    GDNState, equals the one-device mixer: outputs, returned state and every
    gradient (parameters shared by the batch shards summed over them), and
    so do each corner shard's outputs and state against the one-device
    mixer on that shard's rows, channels and heads alone."""
    return _mixer_rows(target, case)


# ------------------------------------------------------------ communication

_COLLECTIVE = re.compile(r"=\s*(\(.*?\)|\S+)\s+(all-reduce|all-gather|all-to-all|"
                         r"collective-permute|reduce-scatter)(?:-start)?\((.*)")
_SHAPE = re.compile(r"[a-z]+\d*\[([\d,]*)\]")
_GROUP_LIST = re.compile(r"(?:replica_groups|source_target_pairs)=\{((?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]"
                          r"(?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}")
_MESH_AXIS = re.compile(r"'([^']+)'=(\d+)")
_REDUCED_AXIS = re.compile(r"'([^']+)'(?::\((\d+)\)(\d+))?")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled HLO module: its kind, its result shapes
    and the groups of logical device ids that exchange data (replica groups;
    for collective-permute the (source, target) pairs); groups is None when
    the HLO writes them in a form this reader does not know."""
    kind: str
    shapes: Tuple[Tuple[int, ...], ...]
    groups: Optional[Tuple[Tuple[int, ...], ...]]


def _ints(text: str) -> List[int]:
    """The integers of a comma-separated list ("2,4" -> [2, 4])."""
    return [int(t) for t in text.split(",") if t]


def _iota(dims: str, perm: Optional[str]) -> np.ndarray:
    """An HLO iota tile `[dims]T(perm)`: arange reshaped to dims, transposed
    by perm (the device ids in that order, shape of dims permuted)."""
    ids = np.arange(int(np.prod(_ints(dims)))).reshape(_ints(dims))
    return ids.transpose(_ints(perm)) if perm else ids


def _mesh_factors(size: int, subaxes: List[Tuple[int, int]]) -> List[Tuple[int, bool]]:
    """A mesh axis of `size` as (factor, in the group) major to minor, from the
    group's sub-axes (pre-size, size) of it (pre-size: product of the factors
    before it)."""
    factors, covered = [], 1
    for pre, sub in sorted(subaxes):
        if pre > covered:
            factors.append((pre // covered, False))
        factors.append((sub, True))
        covered = pre * sub
    if size > covered:
        factors.append((size // covered, False))
    return factors


def _mesh_groups(axes: str, dims: Optional[str], perm: Optional[str],
                 reduced: str) -> np.ndarray:
    """Replica groups [groups, size] of the HLO form `mesh['axis_0'=4,...],
    device_ids=([dims]T(perm)) {'axis_0', 'axis_1':(pre)size}`: the devices
    (in device_ids' order, else iota) laid out on the mesh, one group per
    coordinate of the axes (or sub-axes) not named in braces."""
    sizes = [(name, int(n)) for name, n in _MESH_AXIS.findall(axes)]
    ids = _iota(dims, perm) if dims else np.arange(int(np.prod([n for _, n in sizes])))
    whole, subaxes = set(), {}
    for name, pre, sub in _REDUCED_AXIS.findall(reduced):
        if sub:
            subaxes.setdefault(name, []).append((int(pre), int(sub)))
        else:
            whole.add(name)
    factors = []
    for name, n in sizes:
        factors += [(n, True)] if name in whole else _mesh_factors(n, subaxes.get(name, []))
    ids = ids.reshape([f for f, _ in factors])
    inside = [i for i, (_, g) in enumerate(factors) if g]
    outside = [i for i, (_, g) in enumerate(factors) if not g]
    group_size = int(np.prod([factors[i][0] for i in inside]))
    return ids.transpose(outside + inside).reshape(-1, group_size)


def _groups(attributes: str, devices: int):
    """The device groups written in a collective's attributes (module text
    after its operands); None when no known form matches."""
    if match := _MESH_GROUPS.search(attributes):
        return tuple(map(tuple, _mesh_groups(*match.groups()).tolist()))
    if match := _IOTA_GROUPS.search(attributes):
        dims, perm = match.group(2), match.group(3)
        return tuple(map(tuple, _iota(dims, perm).reshape(_ints(match.group(1))).tolist()))
    if match := _GROUP_LIST.search(attributes):
        groups = tuple(tuple(_ints(g)) for g in re.findall(r"\{([\d,]*)\}", match.group(1)))
        return groups or (tuple(range(devices)),)
    if "replica_groups=" in attributes or "source_target_pairs=" in attributes:
        return None
    return (tuple(range(devices)),)      # no groups written: one group of every device


def collectives(hlo_text: str, devices: int = MESH_DEVICES) -> List[Collective]:
    """Every collective of a compiled HLO module over `devices` devices."""
    found = []
    for match in _COLLECTIVE.finditer(hlo_text):
        shapes = tuple(tuple(int(d) for d in dims.split(",") if d)
                       for dims in _SHAPE.findall(match.group(1)))
        found.append(Collective(match.group(2), shapes, _groups(match.group(3), devices)))
    return found


def moved_axes(groups, axes: Tuple[Tuple[str, int], ...]) -> frozenset:
    """The mesh axes (name, size) along which some group's devices differ:
    logical device id d is the mesh's d-th device in its device order, at
    coordinates unravel_index(d, sizes)."""
    names = [name for name, _ in axes]
    coords = np.stack(np.unravel_index(np.arange(int(np.prod([n for _, n in axes]))),
                                       [n for _, n in axes]), axis=1)
    moved = set()
    for group in groups:
        spread = coords[list(group)]
        moved |= {names[a] for a in range(len(names)) if len(set(spread[:, a])) > 1}
    return frozenset(moved)


def allowed_collectives(case, kind: MeshKind) -> Dict[str, Dict[tuple, frozenset]]:
    """For each kind of collective, the result shapes it may have and the
    mesh axes it may move each along (section 8): nothing for the core op;
    for the mixer, all-reduces of the shared parameters' local gradients
    (conv_weight, a_log / dt_bias without a batch axis) along the batch axis
    and, with a head split, any move of an x-layout tensor (x, dx,
    GDNState.conv, and conv_weight's gradient assembled from the head shards'
    channels) along the head axis. An axis that splits nothing is never
    allowed."""
    if isinstance(case, DeltaRuleCase):
        return {}
    nb, nh = kind.shards
    batch = frozenset({kind.batch_axis} if nb > 1 else ())
    heads = frozenset({kind.head_axis} if nh > 1 else ())
    local_b, c, w = case.batch // nb, case.channels, case.conv_width
    shared = [(w, c // nh)] + [shard_param_shape(s, case.batch, nb, nh)
                               for s in (case.a_log_shape, case.dt_bias_shape)
                               if not param_has_batch_axis(s, case.batch)]
    moves = [(local_b, case.seq_len, c), (local_b, w - 1, c), (w, c)] if nh > 1 else []
    reduce: Dict[tuple, frozenset] = {}
    for shape, axes in [(s, batch) for s in shared] + [(s, heads) for s in moves]:
        reduce[shape] = reduce.get(shape, frozenset()) | axes
    move = {shape: heads for shape in moves}
    return {"all-reduce": reduce, "all-gather": move, "all-to-all": move,
            "collective-permute": move, "reduce-scatter": move}


def communication_fault(found: Collective, allowed, kind: MeshKind) -> Optional[str]:
    """Why a collective is not allowed (allowed_collectives), or None."""
    if found.groups is None:
        return f"{found.kind} {list(found.shapes)}: device groups unreadable"
    by_shape = allowed.get(found.kind, {})
    if not all(s in by_shape for s in found.shapes):
        return f"{found.kind} {list(found.shapes)}: no tensor the contract lets move"
    moved = moved_axes(found.groups, kind.axes)
    permitted = frozenset.intersection(*(by_shape[s] for s in found.shapes))
    if not moved <= permitted:
        return (f"{found.kind} {list(found.shapes)} over axes {sorted(moved)} "
                f"(allowed {sorted(permitted)})")
    return None


# Regression: a conv state gathered off its batch shard (the mutant
# sharded_conv_state_replicated) shows only in a mixer case over a mesh that
# splits the batch; the property's few generated examples may draw none.
MIXER_BATCH_SPLIT = MixerCase(
    batch=1, seq_len=31, k_heads=2, group=2, dk=8, dv=16, chunk=16, conv_width=4,
    dtype="float32", param_dtype="float32", a_log_shape=(1, 4), dt_bias_shape=(1, 4),
    seed=4315524, gate_regime="strong_decay", beta_regime="mixed")


# Regression: with one mesh axis splitting nothing, every collective must move
# data along the other axis only: heads-only on (2, 4) (seed % 6 == 5, data
# unused; the review's case: dx gathered from the head shards, packed, from a
# carried state) and batch-only on (4, 2) (seed % 6 == 4, model unused: the
# shared parameters' gradients).
MIXER_UNUSED_AXIS = (
    mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=5, param_rank=1,
               segments=(((1, 33),), ((2, 9), (0, 24)))),
    mixer_case("gva2-2keys-dk<dv", 2, 33, 16, seed=4, param_rank=1))


@prop("sharded_code_communicates_only_as_allowed", family="sharding",
      strategy=st.one_of(delta_rule_cases(), mixer_cases()),
      examples=(MIXER_BATCH_SPLIT, *MIXER_UNUSED_AXIS),
      wrong_target="gdn_mutant_sharded_conv_state_replicated:xla", weight=0.1,
      devices=MESH_DEVICES, needs=("sharded",),
      covers={**MESH_COVERS, "mixer": lambda c: isinstance(c, MixerCase),
              "core op": CORE_OP})
def sharded_code_communicates_only_as_allowed(target, case):
    """The compiled forward + backward over a mesh of 8 devices holds no
    collective in the core op; in the mixer only all-reduces of the shared
    parameters' gradients along the batch axis and, with a head split,
    moves of x-layout tensors along the head axis; nothing moves along an
    axis that splits nothing (the compiled HLO is read: each collective's
    result shapes and replica groups, mapped to mesh coordinates)."""
    case, on_mesh, _ = _on_mesh(target, case)
    allowed = allowed_collectives(case, on_mesh.kind)
    text = runners.compiled_vjp_text(runners.target_fn(on_mesh, runners.case_op(case)), case,
                                     runners.case_inputs(case))
    kind = on_mesh.kind
    faults = [f for c in collectives(text, MESH_DEVICES)
              if (f := communication_fault(c, allowed, kind)) is not None]
    return [structural_row(f"collectives on {kind.name}", not faults,
                           "not allowed: " + "; ".join(faults[:4]))]


# ------------------------------------------------------------ bad input

def _expect(name, call, error, argument, *words) -> TensorError:
    """Row: call() raises `error` whose message names `argument` (as an
    argument: common.names_argument) and contains every word."""
    try:
        call()
        ok, note = False, "no error raised"
    except error as err:
        missing = [w for w in words if not re.search(rf"(?<![\w.]){re.escape(w)}(?![\w])",
                                                      str(err))]
        missing += [] if names_argument(str(err), argument) else [f"argument {argument}"]
        ok, note = not missing, f"message lacks {missing}: {err}"
    except Exception as err:  # noqa: BLE001 - the finding is the wrong type
        ok, note = False, f"{type(err).__name__} instead of {error.__name__}: {err}"
    return structural_row(name, ok, note[:160])


def _mixer_call(ops_target, case: MixerCase):
    inputs = runners.case_inputs(case)
    return lambda: ops_target.gdn_decoupled_conv1d(
        *(inputs[n] for n in runners.MIXER_INPUTS), **dict(runners.mixer_static(case)))


def _delta_call(ops_target, case: DeltaRuleCase):
    inputs = runners.case_inputs(case)
    s0 = inputs.pop("initial_state", None)
    return lambda: ops_target.gated_delta_rule(*inputs.values(), initial_state=s0,
                                               chunk_size=case.chunk)


def _as_delta_case(case: MixerCase) -> DeltaRuleCase:
    return DeltaRuleCase(batch=case.batch, seq_len=case.seq_len, k_heads=case.k_heads,
                         group=case.group, dk=case.dk, dv=case.dv, chunk=case.chunk,
                         dtype=case.dtype, state_dtype="float32", seed=case.seed)


@prop("sharded_bad_input_raises_named_error", family="sharding",
      strategy=mixer_cases(near_zero=False),
      wrong_target="gdn_mutant_sharded_divisibility_unchecked:xla", weight=0.1,
      devices=MESH_DEVICES, needs=("sharded",), examples=MIXER_GVA_SPLIT[:1], covers=MESH_COVERS)
def sharded_bad_input_raises_named_error(target, case: MixerCase):
    """A batch or a key-head count that the mesh axis does not divide raises
    ValueError naming the argument, the axis and both sizes, before any
    kernel runs; an axis name the mesh lacks, one axis for both splits, or
    a mesh that is not a jax Mesh raise ValueError / TypeError naming the
    argument."""
    case, on_mesh, one = _on_mesh(target, case)
    kind = on_mesh.kind
    nb, nh = kind.shards
    rows = []
    if nb > 1:
        extra = replace(case, batch=case.batch + 1, segments=(), a_log_shape=(case.v_heads,),
                        dt_bias_shape=(case.v_heads,))
        for op, call in (("mixer", _mixer_call(on_mesh, extra)),
                         ("core op", _delta_call(on_mesh, _as_delta_case(extra)))):
            rows.append(_expect(f"{op}: batch {extra.batch} on {kind.name}", call, ValueError,
                                "x" if op == "mixer" else "q", kind.batch_axis,
                                str(extra.batch), str(nb)))
    if nh > 1:
        extra = replace(case, k_heads=case.k_heads + 1, segments=(),
                        a_log_shape=((case.k_heads + 1) * case.group,),
                        dt_bias_shape=((case.k_heads + 1) * case.group,))
        for op, call in (("mixer", _mixer_call(on_mesh, extra)),
                         ("core op", _delta_call(on_mesh, _as_delta_case(extra)))):
            rows.append(_expect(f"{op}: {extra.k_heads} key heads on {kind.name}", call,
                                ValueError, "num_k_heads" if op == "mixer" else "k",
                                kind.head_axis, str(extra.k_heads), str(nh)))
    module, mesh = one.declaration, make_mesh(kind.axes)
    rows += [
        _expect("unknown batch_axis", lambda: module.sharded(mesh, batch_axis="rows"),
                ValueError, "batch_axis", "rows"),
        _expect("unknown head_axis", lambda: module.sharded(mesh, head_axis="heads"),
                ValueError, "head_axis", "heads"),
        _expect("one axis for both", lambda: module.sharded(mesh, batch_axis="data",
                                                            head_axis="data"),
                ValueError, "batch_axis", "head_axis"),
        _expect("mesh not a Mesh", lambda: module.sharded(kind.axes, batch_axis="data"),
                TypeError, "mesh"),
    ]
    return rows
