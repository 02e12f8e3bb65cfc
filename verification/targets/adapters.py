"""Adapters: a kernel written in another convention, made a contract target.

    from verification import adapt, mixer_from_core

    GDN_KERNEL = adapt(my_kernel, layout="head_first", heads="equal",
                       scale="fixed", decay="factor", state_layout="vk")
    GDN_KERNEL = mixer_from_core(adapt(my_core, qk_norm=1e-6))

`adapt` returns a KernelDeclaration whose gated_delta_rule has the
contract's signature (docs/contract.md section 1) and calls the kernel in
its own conventions. The adapter only moves, reshapes, repeats, casts and
converts (exp of a log decay, logit of a probability, segment_ids to
cu_seqlens); it never does the kernel's math. What a convention cannot
carry becomes a declared unsupported feature, so the properties that need
it say "not checkable" with the reason (a fixed scale, no initial state, no
packed rows, a QK norm inside the core op, beta = 1 as a logit).

Deviations are findings, not adaptations: where the kernel returns a
cotangent, an output or a final state in another dtype than the contract's,
the adapter casts it (so every other property judges the values) and
records the deviation; the property `conventions_match_contract` traces
the target and reports one failing row per deviation, which passes only
when the author lists it in the known-failures file.

`mixer_from_core` verifies a kernel that implements only the delta rule
under the mixer properties: the Conv1D, split, QK norm and gates are this
suite's reference layer (gdn_kernels.reference.reference_layer), labelled
"reference layer + your core" on the mixer rows of the summary.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, List, Mapping, NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp

from ..tolerance import CONTRACT_PRECISION
from .declaration import BRIDGE_ATTR, CONTRACT_DTYPES, KernelDeclaration, Supports, bridge_of
from . import varlen as varlen_conv

LAYOUTS = ("batch_first", "head_first")
HEADS = ("grouped", "equal")
SCALES = ("argument", "fixed")
DECAYS = ("log", "factor")
BETAS = ("probability", "logit")
STATE_LAYOUTS = ("kv", "vk")
VARLENS = (None, "segment_ids", "cu_seqlens", "doc_ids")
MIXER_LABEL = "reference layer + your core"


# ------------------------------------------------------------ deviations
class Deviation(NamedTuple):
    """A dtype the kernel produced where the contract asks another."""
    tensor: str          # row name, e.g. "dg dtype"
    got: str
    contract: str


_RECORDERS: List[List[Deviation]] = []


@contextlib.contextmanager
def recording_deviations():
    """Collect the deviations of the adapted calls traced inside (a list of
    Deviation). Dtypes are static: one trace of a target's VJP shows them
    all, nothing needs to run."""
    seen: List[Deviation] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


def _record(tensor: str, got, contract) -> None:
    got, contract = jnp.dtype(got), jnp.dtype(contract)
    if got != contract and _RECORDERS:
        deviation = Deviation(tensor, got.name, contract.name)
        if deviation not in _RECORDERS[-1]:
            _RECORDERS[-1].append(deviation)


def _to_contract_dtype(x, dtype, tensor: str):
    """x cast to the contract's dtype, the difference recorded."""
    _record(tensor, x.dtype, dtype)
    return x.astype(dtype)


def _cotangent_guard(x, name: str):
    """x unchanged; its cotangent cast to x's dtype on the way back (JAX's
    own rules reject a bfloat16 cotangent meeting float32 conversions),
    the difference recorded as a deviation of d<name>."""
    dtype = x.dtype

    @jax.custom_vjp
    def guard(y):
        return y

    def fwd(y):
        return y, None

    def bwd(_, ct):
        return (_to_contract_dtype(ct, dtype, f"d{name} dtype"),)

    guard.defvjp(fwd, bwd)
    return guard(x)


# ------------------------------------------------------------ conventions
@dataclasses.dataclass(frozen=True)
class Conventions:
    """How a kernel takes and returns the core op's tensors.

    layout:        "batch_first" q/k/v [B, T, H, D], g/beta [B, T, H] (the
                   contract) or "head_first" [B, H, T, D], [B, H, T]
    heads:         "grouped" (Hv = G Hk accepted) or "equal" (q, k repeated
                   to Hv heads, interleaved as jnp.repeat(q, G, axis=heads))
    scale:         "argument" or "fixed" (the kernel applies Dk**-0.5)
    qk_norm:       None, or the eps of the L2 norm the kernel applies to q, k
    decay:         "log" (g <= 0) or "factor" (exp(g) in [0, 1], given in float32)
    beta:          "probability" or "logit" (the kernel applies sigmoid; given
                   in float32)
    state_layout:  "kv" [B, H, Dk, Dv] (the contract) or "vk" [B, H, Dv, Dk]
    varlen:        None (no packed rows), "segment_ids" (the contract's),
                   "cu_seqlens" (flattened [1, B*T] rows, offsets [N + 1],
                   one initial state per sequence) or "doc_ids" ([B, T]
                   ids where 0 is an ordinary document)
    initial_state: the kernel takes an initial state (and differentiates it)
    chunk_size:    "argument" (passed as chunk_size=) or None: the kernel takes
                   none (a token scan, or a chunk fixed inside); every case
                   runs, chunk_size_invariance is not checkable
    names:         the kernel's keyword for each contract keyword it takes
                   under another name (scale, initial_state, chunk_size,
                   segment_ids, cu_seqlens, doc_ids)
    kwargs:        keywords passed on every call (e.g. output_final_state=True)
    pallas_interpret: trace the kernel under Pallas TPU interpret mode
                   (pltpu.force_tpu_interpret_mode), for Pallas kernels that
                   take no interpret= argument
    """
    layout: str = "batch_first"
    heads: str = "grouped"
    scale: str = "argument"
    qk_norm: Optional[float] = None
    decay: str = "log"
    beta: str = "probability"
    state_layout: str = "kv"
    varlen: Optional[str] = "segment_ids"
    initial_state: bool = True
    chunk_size: Optional[str] = "argument"
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)
    pallas_interpret: bool = False

    def __post_init__(self):
        for field, allowed in (("layout", LAYOUTS), ("heads", HEADS), ("scale", SCALES),
                               ("decay", DECAYS), ("beta", BETAS),
                               ("state_layout", STATE_LAYOUTS), ("varlen", VARLENS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"adapt: {field}={getattr(self, field)!r}, expected one "
                                 f"of {allowed}")
        if self.chunk_size not in ("argument", None):
            raise ValueError(f"adapt: chunk_size={self.chunk_size!r}, expected 'argument' "
                             f"or None (the kernel takes no chunk size)")
        if self.varlen == "cu_seqlens" and not self.initial_state:
            raise ValueError("adapt: varlen='cu_seqlens' needs initial_state=True (each "
                             "row's first document continues its row's state)")

    def name(self, keyword: str) -> str:
        return self.names.get(keyword, keyword)

    def applied(self) -> Tuple[str, ...]:
        """What the adapter does, one line each (the summary's header)."""
        lines = []
        if self.layout == "head_first":
            lines.append("head-first [B, H, T, D] tensors: transposed to and from [B, T, H, D]")
        if self.heads == "equal":
            lines.append("equal q/k/v heads: q and k repeated to the Hv value heads; GVA "
                         "against its explicit repeat not checkable")
        if self.scale == "fixed":
            lines.append("scale fixed at Dk**-0.5 in the kernel: scale= not checkable")
        if self.qk_norm is not None:
            lines.append(f"QK L2 norm inside the core op (eps={self.qk_norm:g}): the core "
                         f"op's own cases not checkable")
        if self.decay == "factor":
            lines.append("decay as a factor: the kernel is given exp(g)")
        if self.beta == "logit":
            lines.append("beta as a logit: the kernel is given log(beta / (1 - beta)); "
                         "beta = 1 not checkable")
        if self.state_layout == "vk":
            lines.append("state stored [Dv, Dk]: transposed to and from [Dk, Dv]")
        if self.varlen in ("cu_seqlens", "doc_ids"):
            lines.append(f"packed rows as {self.varlen}: segment_ids converted, padding as "
                         f"identity steps (g = 0, beta = 0) whose outputs are dropped")
        if self.varlen is None:
            lines.append("no packed rows: segment_ids not checkable")
        if not self.initial_state:
            lines.append("no initial state: initial_state and carried state not checkable")
        if self.chunk_size is None:
            lines.append("no chunk_size argument: chunk-size invariance not checkable")
        if self.pallas_interpret:
            lines.append("traced under Pallas TPU interpret mode")
        return tuple(lines)

    def supports(self, dtypes, compute_precision: str = CONTRACT_PRECISION) -> Supports:
        return Supports(
            dtypes=tuple(dtypes), compute_precision=compute_precision,
            segment_ids=self.varlen is not None,
            initial_state=self.initial_state, carried_state=False, gva=True,
            kernel_gva=self.heads == "grouped",
            scale=self.scale == "argument",
            chunk_argument=self.chunk_size == "argument",
            validates_input=False, core_qk_norm=self.qk_norm,
            saturated_beta=self.beta == "probability")


# ------------------------------------------------------------ the core op
def _heads_second(x):
    """[B, T, H, ...] <-> [B, H, T, ...]"""
    return jnp.swapaxes(x, 1, 2)


def _swap_state_layout(conv: Conventions, s):
    """A state [..., Dk, Dv] <-> the kernel's [..., Dv, Dk] (state_layout "vk");
    unchanged for "kv". The same transpose serves both directions."""
    return jnp.swapaxes(s, -1, -2) if conv.state_layout == "vk" else s


class _Packing(NamedTuple):
    """A packed call's conversion: the padding mask [B, T] and the kernel
    sequences (None for the contract's own segment_ids)."""
    pad: jnp.ndarray
    sequences: Optional[varlen_conv.KernelSequences]


def _packing(conv: Conventions, segment_ids, batch: int, seq_len: int) -> Optional[_Packing]:
    if conv.varlen in (None, "segment_ids") or (segment_ids is None
                                                 and conv.varlen == "doc_ids"):
        return None
    ids = (jnp.ones((batch, seq_len), jnp.int32) if segment_ids is None
           else jnp.asarray(segment_ids))
    return _Packing(varlen_conv.padding_mask(ids), varlen_conv.kernel_sequences(ids))


def _check_call(conv: Conventions, dk: int, scale, initial_state, chunk_size, segment_ids):
    if conv.scale == "fixed" and scale is not None and abs(scale - dk ** -0.5) > 1e-12 * dk:
        raise ValueError(f"scale: the kernel's scale is fixed at Dk**-0.5 = {dk ** -0.5:g}, "
                         f"got {scale!r}")
    if initial_state is not None and not conv.initial_state:
        raise ValueError("initial_state: the kernel takes no initial state")
    if segment_ids is not None and conv.varlen is None:
        raise ValueError("segment_ids: the kernel takes no packed rows")


def _kernel_inputs(conv: Conventions, q, k, v, g, beta, packing):
    """q, k, v, g, beta in the kernel's conventions (before layout and varlen
    reshapes): identity steps at padding, decay and beta converted, heads
    repeated."""
    if packing is not None:
        pad = packing.pad[..., None]
        g = jnp.where(pad, jnp.zeros_like(g), g)
        beta = jnp.where(pad, jnp.zeros_like(beta), beta)
    # in float32, as the contract computes gates (a bfloat16 exp(g) would
    # round the decay factor to 8 bits before the kernel sees it)
    if conv.decay == "factor":
        g = jnp.exp(g.astype(jnp.float32))
    if conv.beta == "logit":
        beta = beta.astype(jnp.float32)
        beta = jnp.log(beta) - jnp.log1p(-beta)
    if conv.heads == "equal":
        group = v.shape[2] // q.shape[2]
        q, k = jnp.repeat(q, group, axis=2), jnp.repeat(k, group, axis=2)
    return q, k, v, g, beta


def _flatten_rows(x):
    """[B, T, ...] -> [1, B*T, ...]"""
    return x.reshape((1, x.shape[0] * x.shape[1]) + x.shape[2:])


def _kernel_arguments(conv: Conventions, tensors, scale, initial_state, chunk_size,
                      segment_ids, packing):
    """(positional, keyword) arguments of the kernel for a contract call:
    q, k, v, decay, beta converted, reshaped and guarded (_cotangent_guard),
    then scale, chunk size, packed rows and initial state under the kernel's
    names. tensors: the contract's (q, k, v, g, beta)."""
    q, v = tensors[0], tensors[2]
    b, t, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    moved = _kernel_inputs(conv, *tensors, packing)
    if conv.varlen == "cu_seqlens":
        moved = map(_flatten_rows, moved)
    if conv.layout == "head_first":
        moved = map(_heads_second, moved)
    args = [_cotangent_guard(x, name) for name, x in zip(("q", "k", "v", "g", "beta"), moved)]
    kw = dict(conv.kwargs)
    if conv.scale == "argument":
        kw[conv.name("scale")] = dk ** -0.5 if scale is None else scale
    if conv.chunk_size == "argument":
        kw[conv.name("chunk_size")] = chunk_size
    state = initial_state
    if conv.varlen == "cu_seqlens":        # one state per sequence: the rows' first ones
        kw[conv.name("cu_seqlens")] = packing.sequences.cu_seqlens
        slots = jnp.zeros((b * t, hv, dk, dv), jnp.float32)
        state = slots if state is None else slots.at[packing.sequences.row_first].set(
            state.astype(jnp.float32))
    elif conv.varlen == "doc_ids" and packing is not None:
        kw[conv.name("doc_ids")] = packing.sequences.doc_ids
    elif conv.varlen == "segment_ids" and segment_ids is not None:
        kw[conv.name("segment_ids")] = segment_ids
    if state is not None:
        kw[conv.name("initial_state")] = _cotangent_guard(_swap_state_layout(conv, state),
                                                          "initial_state")
    return args, kw


def _contract_outputs(conv: Conventions, o, final, v, packing):
    """The kernel's (o, final_state) back in the contract's layout and dtypes
    (o in v's, the state float32; casts recorded as deviations): per row
    for cu_seqlens, o exactly 0 at the padding the adapter made identity
    steps."""
    b, t, hv, dv = v.shape
    o = _to_contract_dtype(o, v.dtype, "o dtype")
    final = _to_contract_dtype(_swap_state_layout(conv, final), jnp.float32, "final_state dtype")
    if conv.layout == "head_first":
        o = _heads_second(o)
    if conv.varlen == "cu_seqlens":
        o = o.reshape(b, t, hv, dv)
        final = final[packing.sequences.row_last]
    if packing is not None:
        o = jnp.where(packing.pad[..., None, None], jnp.zeros_like(o), o)
    return o, final


def adapt(kernel: Callable, *, dtypes=CONTRACT_DTYPES,
          compute_precision: str = CONTRACT_PRECISION, **conventions) -> KernelDeclaration:
    """A contract target (KernelDeclaration) of `kernel`, a core op written
    in the conventions given (see Conventions; the defaults are the
    contract's). The kernel is called with q, k, v, decay, beta positionally
    and the rest as keywords, and returns (o, final_state).

    dtypes: the activation dtypes the kernel accepts; compute_precision: how
    it computes bfloat16 inputs (Supports.compute_precision)."""
    conv = Conventions(**conventions)

    def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, chunk_size=64,
                         segment_ids=None):
        _check_call(conv, q.shape[3], scale, initial_state, chunk_size, segment_ids)
        packing = _packing(conv, segment_ids, q.shape[0], q.shape[1])
        args, kw = _kernel_arguments(conv, (q, k, v, g, beta), scale, initial_state,
                                     chunk_size, segment_ids, packing)
        with interpret_mode(conv.pallas_interpret):
            o, final = kernel(*args, **kw)
        return _contract_outputs(conv, o, final, v, packing)

    gated_delta_rule.__name__ = f"adapted_{getattr(kernel, '__name__', 'kernel')}"
    gated_delta_rule.__doc__ = (f"{gated_delta_rule.__name__}: the contract's gated_delta_rule "
                                f"over {kernel!r} (verification.targets.adapters.adapt).")
    return KernelDeclaration(gated_delta_rule=_compiled_once(gated_delta_rule,
                                                             ("scale", "chunk_size"), kernel),
                             supports=conv.supports(dtypes, compute_precision),
                             conventions=conv.applied() + bridge_lines(kernel))


def bridge_lines(kernel: Callable) -> Tuple[str, ...]:
    """The summary's line for a kernel run in another framework (from_torch,
    from_mlx)."""
    bridge = bridge_of(kernel)
    return () if bridge is None else (bridge.describe(),)


def _compiled_once(op: Callable, static_argnames, kernel: Optional[Callable] = None) -> Callable:
    """op under jax.jit (one program per shape and static arguments, as the
    contract's ops: a decode loop calling it compiles once), except while
    deviations are recorded: that needs the adapter's Python traced afresh,
    which jit's trace cache would skip. Marked as bridged where the kernel
    it calls is (declaration.bridge_of)."""
    jitted = jax.jit(op, static_argnames=static_argnames)

    def call(*args, **kwargs):
        return (op if _RECORDERS else jitted)(*args, **kwargs)

    call.__name__, call.__doc__ = op.__name__, op.__doc__
    bridge = bridge_of(kernel)
    if bridge is not None:
        setattr(call, BRIDGE_ATTR, bridge)
    return call


def interpret_mode(enabled: bool):
    """Pallas TPU interpret mode over what is traced inside, when enabled."""
    if not enabled:
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.force_tpu_interpret_mode(pltpu.InterpretParams())


# ------------------------------------------------------------ the mixer
def mixer_from_core(core: Union[KernelDeclaration, Callable]) -> KernelDeclaration:
    """The declaration of `core` (a KernelDeclaration, e.g. from adapt, or a
    contract gated_delta_rule) with a mixer: this suite's reference layer
    (conv + SiLU, split, QK norm unless the core applies its own, gates)
    feeding the core. The mixer properties then check the core inside a
    whole layer; their rows say "reference layer + your core"."""
    from gdn_kernels.reference import reference_layer
    from gdn_kernels.state import GDNState

    decl = core if isinstance(core, KernelDeclaration) else KernelDeclaration(core)
    if decl.gated_delta_rule is None:
        raise TypeError("mixer_from_core: core declares no gated_delta_rule (a layer-only "
                        "target has its own mixer: declare it as it is)")
    core_op, own_norm = decl.gated_delta_rule, decl.supports.core_qk_norm

    def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                             head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                             chunk_size=64, segment_ids=None, state=None, return_state=False):
        if own_norm is not None and (not use_qk_norm or eps != own_norm):
            raise ValueError(f"use_qk_norm/eps: the core applies its own QK norm "
                             f"(eps={own_norm:g}); got use_qk_norm={use_qk_norm}, eps={eps:g}")
        q, k, v, g, beta, history = reference_layer(
            x, conv_weight, a, b, a_log, dt_bias, num_k_heads=num_k_heads,
            num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim,
            use_qk_norm=use_qk_norm and own_norm is None, eps=eps, segment_ids=segment_ids,
            conv_state=None if state is None else state.conv)
        kw = {} if segment_ids is None else {"segment_ids": segment_ids}
        if state is not None:
            kw["initial_state"] = state.recurrent
        o, final = core_op(q, k, v, g, beta, scale=scale, chunk_size=chunk_size, **kw)
        o = o.astype(x.dtype)
        if not return_state:
            return o
        return o, GDNState(conv=history.astype(x.dtype), recurrent=final.astype(jnp.float32))

    supports = dataclasses.replace(decl.supports, carried_state=decl.supports.initial_state,
                                   mixer_qk_norm=own_norm)
    static = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "use_qk_norm", "eps",
              "scale", "chunk_size", "return_state")
    return dataclasses.replace(decl, gdn_decoupled_conv1d=_compiled_once(gdn_decoupled_conv1d,
                                                                         static, core_op),
                               supports=supports, mixer_label=MIXER_LABEL,
                               conventions=decl.conventions + (
                                   f"mixer: {MIXER_LABEL} (gdn_kernels.reference."
                                   f"reference_layer)",))
