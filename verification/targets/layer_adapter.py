"""adapt_mixer: a whole GDN layer, written in its own conventions, made a
contract target (the mixer, docs/contract.md section 2) as it is.

    from verification import adapt_mixer

    GDN_KERNEL = adapt_mixer(my_layer, channels="separate", conv_weight="C1K",
                             conv_bias=True, conv_state="ct", output="flat")

The layer is judged whole, its own custom VJP included: the adapter only
moves, reshapes, permutes, splits, concatenates and casts the contract's
tensors (and passes zeros for a conv bias the contract does not have); it
never computes a stage of the layer. What a convention cannot carry is a
declared unsupported feature, so the properties that need it say "not
checkable" with the reason (a fixed QK norm, a fixed scale, no state, an
incoming conv state the layer ignores, no packed rows, no chunk size).

Deviations are findings, as for `adapt`: an output, a returned state or a
cotangent in another dtype than the contract's is cast (so the values are
judged) and recorded for `conventions_match_contract`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, NamedTuple, Optional, Tuple, Union

import jax.numpy as jnp
import numpy as np

from .adapters import (_compiled_once, _cotangent_guard, _to_contract_dtype, bridge_lines,
                       interpret_mode)
from ..tolerance import CONTRACT_PRECISION
from .declaration import CONTRACT_DTYPES, KernelDeclaration, Limits, Supports

CHANNELS = ("qkv", "grouped", "separate")
CONV_WEIGHTS = ("KC", "CK", "C1K", "K1C")
CONV_STATES = ("tc", "ct")
STATE_LAYOUTS = ("kv", "vk")
OUTPUTS = ("bthd", "bhtd", "flat")
DECAY_RATES = ("a_log", "A", "neg_A")
RETURNS = ("contract", "optional", "always", "output")
# The contract mixer's arguments, by the names `order` and `names` use.
ARGUMENTS = ("x", "conv_weight", "conv_bias", "a", "b", "a_log", "dt_bias", "num_k_heads",
             "num_v_heads", "head_k_dim", "head_v_dim", "use_qk_norm", "eps", "scale",
             "chunk_size", "segment_ids", "state", "return_state")
# Tensors a "separate" layer takes as three (its q, k and v parts).
SPLIT_TENSORS = ("x", "conv_weight", "conv_bias")
PARTS = ("q", "k", "v")


class Dims(NamedTuple):
    k_heads: int
    v_heads: int
    dk: int
    dv: int

    @property
    def parts(self) -> Tuple[int, int, int]:
        """Channels of the q, k and v parts of the fused projection."""
        return self.k_heads * self.dk, self.k_heads * self.dk, self.v_heads * self.dv


@dataclasses.dataclass(frozen=True)
class LayerConventions:
    """How a layer takes and returns the mixer's tensors.

    order:       the layer's positional arguments, by the contract's names
                 (ARGUMENTS); every other argument it takes is a keyword
    channels:    "qkv": x [B, T, C] as the contract, all q, all k, all v;
                 "grouped": per key head h, its q, its k, then the v of its
                 G value heads; "separate": three tensors x_q, x_k, x_v (and
                 three conv weights, biases and conv states), each part
                 convolved on its own
    conv_weight: "KC" [K, C] (the contract), "CK" [C, K], "C1K" [C, 1, K]
                 (torch's depthwise Conv1d), "K1C" [K, 1, C]
    conv_bias:   the layer takes a conv bias (held at zero: the contract has
                 none; its gradient is not checked)
    conv_state:  the conv state "tc" [B, K-1, C] (the contract) or "ct"
                 [B, C, K-1]; a tuple of three for "separate" channels
    state_layout: the recurrent state "kv" [B, Hv, Dk, Dv] or "vk" [B, Hv, Dv, Dk]
    a_log:       the decay rate as the layer takes it: "a_log" (the contract's
                 log), "A" = exp(a_log) or "neg_A" = -exp(a_log) (Mamba's
                 A = -exp(A_log)); given in float32, a_log's shape
    qk_norm:     "argument" (the layer takes use_qk_norm= and eps=) or the
                 eps of a QK L2 norm fixed inside the layer
    output:      o as "bthd" [B, T, Hv, Dv], "bhtd" [B, Hv, T, Dv] or
                 "flat" [B, T, Hv*Dv]
    state:       the layer takes an incoming state (conv, recurrent)
    returns:     "contract" (o, or (o, state) under return_state=True),
                 "optional" ((o, state or None) by a return_state flag),
                 "always" ((o, state), no flag) or "output" (o only)
    incoming_conv_state: the layer reads the conv part of its state (False:
                 it starts its conv window from zeros whatever it is given)
    scale:       "argument" or "fixed" (Dk**-0.5 inside)
    chunk_size:  "argument" or None (the layer takes none)
    segment_ids: the layer takes the contract's segment_ids
    gva:         the layer takes more value heads than key heads
    names:       the layer's keyword for each contract argument it takes
                 under another name ("separate": a tuple of three for x,
                 conv_weight and conv_bias; default NAME_q, NAME_k, NAME_v)
    kwargs:      keywords passed on every call
    pallas_interpret: trace the layer under Pallas TPU interpret mode
    """
    order: Tuple[str, ...] = ("x", "conv_weight", "a", "b", "a_log", "dt_bias")
    channels: str = "qkv"
    conv_weight: str = "KC"
    conv_bias: bool = False
    conv_state: str = "tc"
    state_layout: str = "kv"
    a_log: str = "a_log"
    qk_norm: Union[str, float] = "argument"
    output: str = "bthd"
    state: bool = True
    returns: str = "contract"
    incoming_conv_state: bool = True
    scale: str = "argument"
    chunk_size: Optional[str] = "argument"
    segment_ids: bool = True
    gva: bool = True
    names: Mapping[str, Union[str, Tuple[str, str, str]]] = dataclasses.field(
        default_factory=dict)
    kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)
    pallas_interpret: bool = False

    def __post_init__(self):
        for field, allowed in (("channels", CHANNELS), ("conv_weight", CONV_WEIGHTS),
                               ("conv_state", CONV_STATES), ("state_layout", STATE_LAYOUTS),
                               ("a_log", DECAY_RATES),
                               ("output", OUTPUTS), ("returns", RETURNS),
                               ("scale", ("argument", "fixed")),
                               ("chunk_size", ("argument", None))):
            if getattr(self, field) not in allowed:
                raise ValueError(f"adapt_mixer: {field}={getattr(self, field)!r}, expected "
                                 f"one of {allowed}")
        if self.qk_norm != "argument" and not (isinstance(self.qk_norm, (int, float))
                                               and self.qk_norm > 0):
            raise ValueError(f"adapt_mixer: qk_norm={self.qk_norm!r}, expected 'argument' "
                             f"or the eps (> 0) of the QK norm fixed inside the layer")
        unknown = [n for n in tuple(self.order) + tuple(self.names) if n not in ARGUMENTS]
        if unknown or len(set(self.order)) != len(self.order):
            raise ValueError(f"adapt_mixer: order/names {unknown or list(self.order)}: each "
                             f"once, from {ARGUMENTS}")
        if self.returns == "output" and self.state:
            raise ValueError("adapt_mixer: returns='output' with state=True: a layer that "
                             "takes a state returns one (say state=False)")

    def name(self, argument: str):
        """The layer's keyword(s) for a contract argument."""
        if argument in self.names:
            return self.names[argument]
        if self.channels == "separate" and argument in SPLIT_TENSORS:
            return tuple(f"{argument}_{p}" for p in PARTS)
        return argument

    @property
    def fixed_qk_norm(self) -> Optional[float]:
        return None if self.qk_norm == "argument" else float(self.qk_norm)

    @property
    def carries_state(self) -> bool:
        return self.state and self.returns != "output"

    def applied(self) -> Tuple[str, ...]:
        """What the adapter does, one line each (the summary's header)."""
        lines = [f"layer: {LAYER_LABEL} (verification.adapt_mixer)"]
        if self.channels == "grouped":
            lines.append("fused projection grouped per key head (q, k, then its value "
                         "heads' v): x, conv weight and conv state channels permuted")
        if self.channels == "separate":
            lines.append("separate q, k, v inputs, conv weights and conv states: split "
                         "from and joined to the contract's fused channels")
        if self.conv_weight != "KC":
            lines.append(f"conv weight {self.conv_weight}: moved from [K, C]")
        if self.conv_bias:
            lines.append("conv bias held at zero (the contract has none): its gradient is "
                         "not checked")
        if self.conv_state == "ct":
            lines.append("conv state [B, C, K-1]: transposed to and from [B, K-1, C]")
        if self.state_layout == "vk":
            lines.append("recurrent state [Dv, Dk]: transposed to and from [Dk, Dv]")
        if self.a_log != "a_log":
            sign = "-" if self.a_log == "neg_A" else ""
            lines.append(f"decay rate as {self.a_log}: the layer is given {sign}exp(a_log), "
                         f"in float32")
        if self.fixed_qk_norm is not None:
            lines.append(f"QK L2 norm fixed inside the layer (eps={self.fixed_qk_norm:g}): "
                         f"cases with another eps or no norm not checkable")
        if self.output != "bthd":
            lines.append(f"o returned {self.output}: moved to [B, T, Hv, Dv]")
        if not self.carries_state:
            lines.append("no carried state: state=/return_state= not checkable")
        elif not self.incoming_conv_state:
            lines.append("incoming conv state ignored by the layer: calls after a conv "
                         "history not checkable")
        if self.scale == "fixed":
            lines.append("scale fixed at Dk**-0.5 in the layer: scale= not checkable")
        if self.chunk_size is None:
            lines.append("no chunk_size argument: chunk-size invariance not checkable")
        if not self.segment_ids:
            lines.append("no packed rows: segment_ids not checkable")
        if not self.gva:
            lines.append("equal q/k/v heads only: GVA not checkable")
        if self.pallas_interpret:
            lines.append("traced under Pallas TPU interpret mode")
        return tuple(lines)

    def supports(self, dtypes, compute_precision) -> Supports:
        return Supports(
            dtypes=tuple(dtypes), segment_ids=self.segment_ids,
            carried_state=self.carries_state,
            incoming_conv_state=self.incoming_conv_state, gva=self.gva,
            scale=self.scale == "argument", chunk_argument=self.chunk_size == "argument",
            validates_input=False, mixer_qk_norm=self.fixed_qk_norm,
            compute_precision=compute_precision)


LAYER_LABEL = "your layer, whole"


# ------------------------------------------------------------ channels
def grouped_channel_order(dims: Dims) -> np.ndarray:
    """[C] int: channel i of a fused projection grouped per key head (its q,
    its k, then the v of its G value heads) is contract channel order[i]."""
    nq, per_v = dims.k_heads * dims.dk, (dims.v_heads // dims.k_heads) * dims.dv
    order = []
    for h in range(dims.k_heads):
        order += list(range(h * dims.dk, (h + 1) * dims.dk))
        order += list(range(nq + h * dims.dk, nq + (h + 1) * dims.dk))
        order += list(range(2 * nq + h * per_v, 2 * nq + (h + 1) * per_v))
    return np.asarray(order)


def _to_layer_channels(conv: LayerConventions, dims: Dims, x, axis: int):
    """A tensor with the contract's channels on `axis`, in the layer's
    channel convention (a tuple of three parts for "separate")."""
    if conv.channels == "grouped":
        return jnp.take(x, grouped_channel_order(dims), axis=axis)
    if conv.channels == "separate":
        cuts = np.cumsum(dims.parts)[:2]
        return tuple(jnp.split(x, cuts, axis=axis))
    return x


def _to_contract_channels(conv: LayerConventions, dims: Dims, x, axis: int):
    """The inverse of _to_layer_channels."""
    if conv.channels == "grouped":
        return jnp.take(x, np.argsort(grouped_channel_order(dims)), axis=axis)
    if conv.channels == "separate":
        return jnp.concatenate(x, axis=axis)
    return x


def _each(f, x):
    """f over the parts of a "separate" tensor (a tuple), or on x."""
    return tuple(map(f, x)) if isinstance(x, tuple) else f(x)


def _conv_weight_layout(conv: LayerConventions, w):
    """A [K, C'] weight (one part's, or the whole) in the layer's layout."""
    return {"KC": lambda: w, "CK": lambda: w.T, "C1K": lambda: w.T[:, None, :],
            "K1C": lambda: w[:, None, :]}[conv.conv_weight]()


def _swap_last(x):
    return jnp.swapaxes(x, -1, -2)


# ------------------------------------------------------------ the call
def _check_call(conv: LayerConventions, dims: Dims, use_qk_norm, eps, scale, segment_ids,
                state, return_state):
    """ValueError naming the argument the layer cannot take."""
    own = conv.fixed_qk_norm
    if own is not None and (not use_qk_norm or eps != own):
        raise ValueError(f"use_qk_norm/eps: the layer's QK norm is fixed (eps={own:g}); got "
                         f"use_qk_norm={use_qk_norm}, eps={eps:g}")
    if conv.scale == "fixed" and scale is not None \
            and abs(scale - dims.dk ** -0.5) > 1e-12 * dims.dk:
        raise ValueError(f"scale: the layer's scale is fixed at Dk**-0.5, got {scale!r}")
    if segment_ids is not None and not conv.segment_ids:
        raise ValueError("segment_ids: the layer takes no packed rows")
    if state is not None and not conv.state:
        raise ValueError("state: the layer takes no incoming state")
    if return_state and not conv.carries_state:
        raise ValueError("return_state: the layer returns no state")
    if not conv.gva and dims.v_heads != dims.k_heads:
        raise ValueError("num_v_heads: the layer takes equal q/k/v heads only")


def _layer_state(conv: LayerConventions, dims: Dims, state):
    """The contract's GDNState as the layer's (conv, recurrent)."""
    conv_state = _to_layer_channels(conv, dims, state.conv, axis=-1)
    if conv.conv_state == "ct":
        conv_state = _each(_swap_last, conv_state)
    conv_state = _each(lambda s: _cotangent_guard(s, "state.conv"), conv_state)
    recurrent = state.recurrent if conv.state_layout == "kv" else _swap_last(state.recurrent)
    return conv_state, _cotangent_guard(recurrent, "state.recurrent")


def _contract_state(conv: LayerConventions, dims: Dims, layer_state, x_dtype):
    """The layer's returned (conv, recurrent) as the contract's GDNState."""
    from gdn_kernels.state import GDNState

    conv_state, recurrent = layer_state
    if conv.conv_state == "ct":
        conv_state = _each(_swap_last, conv_state)
    conv_state = _to_contract_channels(conv, dims, conv_state, axis=-1)
    if conv.state_layout == "vk":
        recurrent = _swap_last(recurrent)
    return GDNState(conv=_to_contract_dtype(conv_state, x_dtype, "state.conv dtype"),
                    recurrent=_to_contract_dtype(recurrent, jnp.float32,
                                                 "state.recurrent dtype"))


def _contract_output(conv: LayerConventions, dims: Dims, o, x):
    """The layer's o as [B, T, Hv, Dv] in x's dtype."""
    if conv.output == "bhtd":
        o = jnp.swapaxes(o, 1, 2)
    elif conv.output == "flat":
        o = o.reshape(o.shape[:2] + (dims.v_heads, dims.dv))
    return _to_contract_dtype(o, x.dtype, "o dtype")


def _decay_rate(conv: LayerConventions, a_log):
    """a_log as the layer takes it: as is, exp(a_log) or -exp(a_log) (in
    float32, as the contract computes gates)."""
    if conv.a_log == "a_log":
        return a_log
    rate = jnp.exp(a_log.astype(jnp.float32))
    return -rate if conv.a_log == "neg_A" else rate


def _layer_tensors(conv: LayerConventions, dims: Dims, x, conv_weight, a, b, a_log, dt_bias):
    """{contract name: the tensor (or three parts) in the layer's conventions},
    each guarded (its cotangent cast back to the primal's dtype, a
    difference recorded)."""
    xs = _to_layer_channels(conv, dims, x, axis=-1)
    w_parts = _to_layer_channels(conv, dims, conv_weight, axis=-1)      # [K, C'] each
    ws = _each(lambda w: _conv_weight_layout(conv, w), w_parts)
    tensors = {"x": xs, "conv_weight": ws, "a": a, "b": b, "a_log": _decay_rate(conv, a_log),
               "dt_bias": dt_bias}
    tensors = {n: _each(lambda t, n=n: _cotangent_guard(t, n), t) for n, t in tensors.items()}
    if conv.conv_bias:
        tensors["conv_bias"] = _each(lambda w: jnp.zeros(w.shape[-1], conv_weight.dtype),
                                     w_parts)
    return tensors


def _arguments(conv: LayerConventions, values: Mapping[str, object]):
    """(positional, keyword) arguments of the layer: `values` by the
    contract's names, the ones in `order` positionally (a "separate"
    tensor as three), the rest under the layer's keywords."""
    args, kw = [], dict(conv.kwargs)
    for name in conv.order:
        if name not in values:
            raise ValueError(f"adapt_mixer: order names {name!r}, which this call does not "
                             f"pass to the layer (see the conventions that drop it)")
        value = values[name]
        args += list(value) if isinstance(value, tuple) and name in SPLIT_TENSORS else [value]
    for name, value in values.items():
        if name in conv.order:
            continue
        key = conv.name(name)
        if isinstance(key, tuple):
            kw.update(zip(key, value))
        else:
            kw[key] = value
    return args, kw


def adapt_mixer(layer: Callable, *, dtypes=CONTRACT_DTYPES, limits: Optional[Limits] = None,
                compute_precision: str = CONTRACT_PRECISION, **conventions) -> KernelDeclaration:
    """A layer-only contract target (KernelDeclaration) of `layer`, a whole
    GDN mixer written in the conventions given (see LayerConventions; the
    defaults are the contract's). The mixer properties judge the layer
    whole, its own VJP included; the core op's cases are not checkable.

    dtypes: the activation dtypes the layer accepts; limits: the shapes it
    takes (Limits); compute_precision: how it computes bfloat16 inputs
    (Supports.compute_precision)."""
    conv = LayerConventions(**conventions)

    def gdn_decoupled_conv1d(x, conv_weight, a, b, a_log, dt_bias, *, num_k_heads, num_v_heads,
                             head_k_dim, head_v_dim, use_qk_norm=True, eps=1e-6, scale=None,
                             chunk_size=64, segment_ids=None, state=None, return_state=False):
        dims = Dims(num_k_heads, num_v_heads, head_k_dim, head_v_dim)
        _check_call(conv, dims, use_qk_norm, eps, scale, segment_ids, state, return_state)
        values = _layer_tensors(conv, dims, x, conv_weight, a, b, a_log, dt_bias)
        values.update(num_k_heads=num_k_heads, num_v_heads=num_v_heads,
                      head_k_dim=head_k_dim, head_v_dim=head_v_dim)
        if conv.qk_norm == "argument":
            values.update(use_qk_norm=use_qk_norm, eps=eps)
        if conv.scale == "argument":
            values["scale"] = head_k_dim ** -0.5 if scale is None else scale
        if conv.chunk_size == "argument":
            values["chunk_size"] = chunk_size
        if segment_ids is not None:
            values["segment_ids"] = segment_ids
        if state is not None or ("state" in conv.order and conv.state):
            values["state"] = None if state is None else _layer_state(conv, dims, state)
        if conv.returns in ("contract", "optional"):
            values["return_state"] = return_state
        args, kw = _arguments(conv, values)
        with interpret_mode(conv.pallas_interpret):
            out = layer(*args, **kw)
        if conv.returns == "output" or (conv.returns == "contract" and not return_state):
            return _contract_output(conv, dims, out, x)
        o, layer_state = out
        o = _contract_output(conv, dims, o, x)
        return (o, _contract_state(conv, dims, layer_state, x.dtype)) if return_state else o

    gdn_decoupled_conv1d.__name__ = f"adapted_{getattr(layer, '__name__', 'layer')}"
    gdn_decoupled_conv1d.__doc__ = (f"{gdn_decoupled_conv1d.__name__}: the contract's mixer "
                                    f"over {layer!r} (verification.adapt_mixer).")
    static = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "use_qk_norm", "eps",
              "scale", "chunk_size", "return_state")
    return KernelDeclaration(
        gdn_decoupled_conv1d=_compiled_once(gdn_decoupled_conv1d, static, layer),
        supports=conv.supports(dtypes, compute_precision),
        conventions=conv.applied() + bridge_lines(layer),
        limits=limits or Limits())
