"""What a target is and what it supports, declared by its author.

A target module either exports a declaration,

    from verification import KernelDeclaration, Supports

    GDN_KERNEL = KernelDeclaration(
        gated_delta_rule=my_delta_rule,          # the core op
        gdn_decoupled_conv1d=my_mixer,           # the mixer (the layer)
        supports=Supports(dtypes=("float32",), segment_ids=False))

(at least one of the two ops: a layer-only target declares the mixer alone,
and the core op's cases are not checkable on it), or simply defines the
contract's functions (docs/contract.md): then the
declaration is read off the module (`declaration_of`), every optional piece
it has is used, and the whole contract is assumed supported.

Every property states what it needs (`NEEDS`, registry.prop(needs=...)),
and each case what it asks of the target (`case_needs`); where the target
lacks it the property answers "not checkable: <reason>", never a pass, and
never runs the suite's own code in the target's place.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence, Tuple

from ..tolerance import CONTRACT_PRECISION, PRECISIONS

# The module attribute a target exports its declaration under.
DECLARATION_ATTR = "GDN_KERNEL"
# The attribute a function running its kernel in another framework carries
# (verification/targets/bridge.py: from_torch and from_mlx mark what they return,
# the adapters mark their wrappers of it): where it runs.
BRIDGE_ATTR = "gdn_bridge"

CONTRACT_DTYPES = ("float32", "bfloat16")
CONTRACT_CHUNK_SIZES = (16, 32, 64, 128)


@dataclasses.dataclass(frozen=True)
class Supports:
    """What the target accepts (defaults: the whole contract).

    dtypes:          activation dtypes accepted (float32, bfloat16)
    segment_ids:     packed rows (contract section 6)
    initial_state:   gated_delta_rule's initial_state, and its gradient
    carried_state:   the mixer's state= / return_state= and decode (section 7)
    incoming_conv_state: the conv part of an incoming state= is used (False:
                     a layer that takes state= and returns its state but
                     starts its conv window from zeros whatever it is handed;
                     its returned conv and recurrent state, its incoming
                     recurrent state and their gradients are still checked,
                     a call after a conv history is not)
    gva:             more value heads than key heads (Hv = G Hk, G > 1)
    kernel_gva:      the kernel itself takes fewer key heads than value heads
                     (False: the adapter repeats q and k to the value heads,
                     adapt(heads="equal"): GVA cases run through that repeat,
                     and the property that compares GVA with an explicit
                     repeat is not checkable, both its sides being the
                     adapter's repeat)
    scale:           a scale= other than the default Dk**-0.5
    chunk_sizes:     the chunk_size values accepted (None: every one the
                     contract allows, 16..128); may add 256, beyond the
                     contract, as field kernels use (then its cases are drawn)
    chunk_argument:  the ops take chunk_size and chunk with it (False: a
                     scan, or a chunk fixed inside; chunk-size invariance
                     cannot be checked)
    validates_input: bad input raises the contract's named errors (section 5)
    core_qk_norm:    the eps of a QK L2 norm the core op applies itself (None:
                     it takes q and k as given, as the contract says; else its
                     own cases are not checkable)
    mixer_qk_norm:   the mixer accepts only use_qk_norm=True with this eps
                     (a layer with its QK norm fixed inside, or a mixer built
                     on a core that norms; None: any)
    saturated_beta:  beta exactly 1 (a convention of beta as a logit cannot
                     carry it)
    compute_precision: how the kernel computes its bfloat16-input cases, a
                     verification.tolerance.PRECISIONS key: "float32" (the
                     contract), "bfloat16" (bfloat16 products, float32
                     state) or "bfloat16-state" (the state in bfloat16 too).
                     Its cases are judged against a reference under that
                     precision's rounding model; where the contract's
                     float32 bound is missed but the declared one holds, the
                     summary lists a deviation row (not a failure).
                     float32-input cases are always held to the contract.
    """
    dtypes: Tuple[str, ...] = CONTRACT_DTYPES
    segment_ids: bool = True
    initial_state: bool = True
    carried_state: bool = True
    incoming_conv_state: bool = True
    gva: bool = True
    kernel_gva: bool = True
    scale: bool = True
    chunk_sizes: Optional[Tuple[int, ...]] = None
    chunk_argument: bool = True
    validates_input: bool = True
    core_qk_norm: Optional[float] = None
    mixer_qk_norm: Optional[float] = None
    saturated_beta: bool = True
    compute_precision: str = CONTRACT_PRECISION


class OutsideLimits(Exception):
    """A check would call the target on a shape its declared limits refuse
    (a prefix, a piece, a rerun at another batch size or parameter rank):
    that example is not checkable, with the limit as its reason."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The shapes a target takes, as its author declares them
    (KernelDeclaration.limits; defaults: the whole contract). The lattice
    (strategies.lattice) is then built inside them (every pair of the values they allow, rows
    that break a limit dropped), and a case outside them is not checkable.

    seq_multiple_of_chunk: T a whole number of chunks only (a kernel that
                      reshapes T into chunks); the lengths C, 2C, 3C are drawn
    min_seq_len, max_seq_len: the tokens of one call (None: no maximum)
    batch_sizes:      the batch sizes taken (None: any; e.g. (1,) for a
                      varlen kernel that flattens its documents)
    param_ranks:      the ranks a_log / dt_bias are taken at (1 [Hv], 2
                      [B, Hv], 3 [B, T, Hv])
    per_batch_params_at: the batch sizes at which a_log / dt_bias may have a
                      batch axis of that size (None: any; a leading axis of
                      1 broadcasts and is always taken)
    """
    seq_multiple_of_chunk: bool = False
    min_seq_len: int = 1
    max_seq_len: Optional[int] = None
    batch_sizes: Optional[Tuple[int, ...]] = None
    param_ranks: Tuple[int, ...] = (1, 2, 3)
    per_batch_params_at: Optional[Tuple[int, ...]] = None

    def __post_init__(self):
        if not isinstance(self.min_seq_len, int) or self.min_seq_len < 1:
            raise ValueError(f"limits.min_seq_len must be an int >= 1, got {self.min_seq_len!r}")
        if self.max_seq_len is not None and (not isinstance(self.max_seq_len, int)
                                             or self.max_seq_len < self.min_seq_len):
            raise ValueError(f"limits.max_seq_len must be an int >= min_seq_len "
                             f"({self.min_seq_len}) or None, got {self.max_seq_len!r}")
        for name in ("batch_sizes", "per_batch_params_at"):
            sizes = getattr(self, name)
            if sizes is not None and (not sizes or not all(isinstance(b, int) and b >= 1
                                                           for b in sizes)):
                raise ValueError(f"limits.{name} must be a non-empty tuple of ints >= 1 or "
                                 f"None, got {sizes!r}")
        if not self.param_ranks or not set(self.param_ranks) <= {1, 2, 3}:
            raise ValueError(f"limits.param_ranks must be a non-empty subset of (1, 2, 3), "
                             f"got {self.param_ranks!r}")

    @property
    def declared(self) -> bool:
        return self != Limits()

    def refuses(self, seq_len: int, chunk: int, batch: int,
                param_shapes: Sequence[Tuple[int, ...]] = ()) -> Optional[str]:
        """Why a call of this shape is outside the limits, or None."""
        if self.seq_multiple_of_chunk and seq_len % chunk:
            return (f"the target takes T a multiple of its chunk size only, not T={seq_len}, "
                    f"C={chunk}")
        if seq_len < self.min_seq_len or (self.max_seq_len is not None
                                          and seq_len > self.max_seq_len):
            top = "" if self.max_seq_len is None else f"..{self.max_seq_len}"
            return f"the target takes T in {self.min_seq_len}{top or '..'}, not T={seq_len}"
        if self.batch_sizes is not None and batch not in self.batch_sizes:
            return f"the target takes batch sizes {list(self.batch_sizes)}, not B={batch}"
        for shape in param_shapes:
            if len(shape) not in self.param_ranks:
                return (f"the target takes a_log / dt_bias of ranks {list(self.param_ranks)}, "
                        f"not {list(shape)}")
            per_batch = len(shape) > 1 and shape[0] == batch > 1
            if per_batch and self.per_batch_params_at is not None \
                    and batch not in self.per_batch_params_at:
                return (f"the target takes a_log / dt_bias with a batch axis only at batch "
                        f"sizes {list(self.per_batch_params_at)}, not {list(shape)} at B={batch}")
        return None

    def refuses_case(self, case) -> Optional[str]:
        """Why a case (strategies.cases) is outside the limits, or None."""
        shapes = [getattr(case, n) for n in ("a_log_shape", "dt_bias_shape") if hasattr(case, n)]
        return self.refuses(case.seq_len, case.chunk, case.batch, shapes)


@dataclasses.dataclass(frozen=True)
class KernelDeclaration:
    """A kernel under test: its functions and what it supports.

    gated_delta_rule:      the core op, with the contract's signature (None: a
                           layer-only target; the core op's cases are not checkable)
    gdn_decoupled_conv1d:  the mixer (None: the mixer properties are not checkable)
    sharded:               sharded(mesh, batch_axis=, head_axis=) -> ops (section 8)
    l2norm_forward:        l2norm_forward(x, eps) -> y, the target's QK L2 norm
    l2norm_backward:       l2norm_backward(x, dy, eps) -> dx, its VJP
    supports:              what the functions accept (Supports)
    conventions:           what an adapter (verification.targets.adapters) did to
                           reach the contract's signature, one line each
    mixer_label:           what the mixer is, when it is not the author's own
                           (e.g. "reference layer + your core"): shown on the
                           mixer properties' rows
    tolerance:             a known imprecision the author accepts, as torch's
                           toleranceOverride: tensor name (a row's first word,
                           e.g. "da_log") -> factor F > 1 over the policy's
                           bound. A finite miss of that tensor within F holds,
                           listed apart ("held at the declared tolerance",
                           its ratio at the policy's bound); beyond F it fails
                           as before. Never global, never a default.
    limits:                the shapes the kernel takes (Limits: T a multiple of
                           its chunk, T's range, batch sizes, a_log / dt_bias
                           ranks and batch axes): cases are drawn inside them;
                           one outside is not checkable, with the limit
    """
    gated_delta_rule: Optional[Callable] = None
    gdn_decoupled_conv1d: Optional[Callable] = None
    sharded: Optional[Callable] = None
    l2norm_forward: Optional[Callable] = None
    l2norm_backward: Optional[Callable] = None
    supports: Supports = Supports()
    conventions: Tuple[str, ...] = ()
    mixer_label: Optional[str] = None
    tolerance: Mapping[str, float] = dataclasses.field(default_factory=dict)
    limits: Limits = Limits()

    def __post_init__(self):
        if self.gated_delta_rule is None and self.gdn_decoupled_conv1d is None:
            raise TypeError("KernelDeclaration: declare gated_delta_rule (the core op), "
                            "gdn_decoupled_conv1d (the layer), or both")
        for name in ("gated_delta_rule", "gdn_decoupled_conv1d", "sharded", "l2norm_forward",
                     "l2norm_backward"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"KernelDeclaration: {name} must be callable or None")
        for tensor, factor in dict(self.tolerance).items():
            if not isinstance(tensor, str) or not tensor or " " in tensor:
                raise ValueError(f"KernelDeclaration: tolerance key {tensor!r} is not a tensor "
                                 "name (a row's first word, e.g. 'da_log')")
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) \
                    or not math.isfinite(factor) or factor <= 1:
                raise ValueError(f"KernelDeclaration: tolerance[{tensor!r}] = {factor!r}: a "
                                 "factor over the policy's bound is a finite number > 1")
        if not isinstance(self.limits, Limits):
            raise TypeError(f"KernelDeclaration: limits must be a Limits, got "
                            f"{type(self.limits).__name__}")
        if self.supports.compute_precision not in PRECISIONS:
            raise ValueError(f"KernelDeclaration: supports.compute_precision "
                             f"{self.supports.compute_precision!r} is not one of "
                             f"{sorted(PRECISIONS)}")
        if self.supports.chunk_sizes is not None:
            # the sizes beyond the contract a target may declare are the
            # lattice's (imported here: importing the package stays free of
            # Hypothesis)
            from strategies.lattice import BEYOND_CONTRACT_CHUNKS
            chunks = set(self.supports.chunk_sizes) - set(CONTRACT_CHUNK_SIZES
                                                          + BEYOND_CONTRACT_CHUNKS)
            if chunks:
                raise ValueError(f"KernelDeclaration: supports.chunk_sizes {sorted(chunks)} "
                                 f"are neither contract chunk sizes {CONTRACT_CHUNK_SIZES} "
                                 f"nor {BEYOND_CONTRACT_CHUNKS}")
        unknown = set(self.supports.dtypes) - set(CONTRACT_DTYPES)
        if unknown:
            raise ValueError(f"KernelDeclaration: supports.dtypes {sorted(unknown)} are not "
                             f"contract dtypes {CONTRACT_DTYPES}")


def declaration_of(module) -> KernelDeclaration:
    """The module's declaration: its GDN_KERNEL, or one read off the
    contract's functions it defines (ValueError naming what is missing)."""
    declared = getattr(module, DECLARATION_ATTR, None)
    if declared is not None:
        if not isinstance(declared, KernelDeclaration):
            raise ValueError(f"{module.__name__}.{DECLARATION_ATTR} is a "
                             f"{type(declared).__name__}, not a KernelDeclaration")
        return declared
    def optional(name):
        fn = getattr(module, name, None)
        return fn if callable(fn) else None

    if optional("gated_delta_rule") is None and optional("gdn_decoupled_conv1d") is None:
        raise ValueError(f"module {module.__name__!r} has no callable gated_delta_rule or "
                         f"gdn_decoupled_conv1d (docs/contract.md) and no {DECLARATION_ATTR} "
                         "declaration")
    return KernelDeclaration(
        gated_delta_rule=optional("gated_delta_rule"),
        gdn_decoupled_conv1d=optional("gdn_decoupled_conv1d"),
        sharded=optional("sharded"),
        l2norm_forward=optional("l2norm_forward"),
        l2norm_backward=optional("l2norm_backward"))


def bridge_of(fn):
    """Where a bridged function's kernel runs (bridge.Bridge), or None
    for a JAX function."""
    return getattr(fn, BRIDGE_ATTR, None) if fn is not None else None


def is_bridged(declaration: KernelDeclaration) -> bool:
    """An op of the declaration runs its kernel in another framework."""
    return any(bridge_of(fn) is not None for fn in (declaration.gated_delta_rule,
                                                    declaration.gdn_decoupled_conv1d))


# ---------------------------------------------------------------- needs
INCOMING_CONV_STATE_IGNORED = ("the target ignores the incoming conv state "
                               "(Supports(incoming_conv_state=False))")

# Each need a property or a case may have, and the reason given when the
# declaration lacks it: need -> (is it met?, why not).
NEEDS = {
    "core": (lambda d: d.gated_delta_rule is not None,
             "the target exposes no core op (gated_delta_rule): a layer-only target"),
    "mixer": (lambda d: d.gdn_decoupled_conv1d is not None,
              "the target declares no mixer (gdn_decoupled_conv1d)"),
    "sharded": (lambda d: d.sharded is not None,
                "the target declares no sharded() (contract section 8)"),
    "l2norm_hooks": (lambda d: d.l2norm_forward is not None and d.l2norm_backward is not None,
                     "the target declares no l2norm_forward / l2norm_backward hooks"),
    "segment_ids": (lambda d: d.supports.segment_ids,
                    "the target declares no packed rows (segment_ids)"),
    "initial_state": (lambda d: d.supports.initial_state,
                      "the target declares no initial_state for gated_delta_rule"),
    "carried_state": (lambda d: d.supports.carried_state,
                      "the target declares no carried state (state= / return_state=)"),
    "incoming_conv_state": (lambda d: d.supports.incoming_conv_state,
                            INCOMING_CONV_STATE_IGNORED),
    "gva": (lambda d: d.supports.gva,
            "the target declares no GVA (Hv > Hk)"),
    "kernel_gva": (lambda d: d.supports.kernel_gva,
                   "the kernel has no GVA: the adapter repeats q and k to the value heads "
                   "(heads=\"equal\"), so the GVA run and its explicit repeat both run "
                   "that repeat"),
    "scale": (lambda d: d.supports.scale,
              "the target declares no scale= argument"),
    "validates_input": (lambda d: d.supports.validates_input,
                        "the target declares no input validation (contract section 5)"),
    "chunk_argument": (lambda d: d.supports.chunk_argument,
                       "the kernel takes no chunk_size (a scan, or a chunk fixed inside)"),
    "saturated_beta": (lambda d: d.supports.saturated_beta,
                       "the kernel takes beta as a logit: beta = 1 has no finite logit"),
    "xla_programs": (lambda d: not is_bridged(d),
                     "the kernel runs in another framework through a bridge (from_torch, "
                     "from_mlx): XLA compile counts are the suite's wrapper's, not the kernel's"),
}


def unmet(declaration: KernelDeclaration, needs) -> Optional[str]:
    """The reason the first unmet need is not met, or None. A need is a
    NEEDS key, "dtype:<name>" or "chunk_size:<n>"."""
    supports = declaration.supports
    for need in needs:
        kind, _, value = need.partition(":")
        if kind == "dtype":
            if value not in supports.dtypes:
                return f"the target declares dtypes {list(supports.dtypes)}, not {value}"
        elif kind == "qk_norm":
            reason = _qk_norm_unmet(supports, value)
            if reason:
                return reason
        elif kind == "chunk_size":
            accepted = supports.chunk_sizes or CONTRACT_CHUNK_SIZES
            if int(value) not in accepted:
                return f"the target declares chunk sizes {list(accepted)}, not {value}"
        else:
            met, why = NEEDS[need]
            if not met(declaration):
                return why
    return None


def _qk_norm_unmet(supports: Supports, value: str) -> Optional[str]:
    """value "core" (a core-op case: q, k as given) or the mixer case's eps
    ("off" without the norm)."""
    if value == "core":
        if supports.core_qk_norm is not None:
            return (f"the core op L2-normalises q and k itself (eps={supports.core_qk_norm:g}); "
                    f"the contract's gated_delta_rule takes them as given")
        return None
    fixed = supports.mixer_qk_norm
    if fixed is not None and (value == "off" or float(value) != fixed):
        wanted = "no QK norm" if value == "off" else f"eps={float(value):g}"
        return (f"the mixer's QK norm is fixed inside it (use_qk_norm=True, eps={fixed:g}); "
                f"the case asks for {wanted}")
    return None


def check_needs(needs) -> None:
    """ValueError naming a need that is not a NEEDS key (registration time)."""
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"unknown need(s) {unknown}; known: {sorted(NEEDS)}")


def precision_of(declaration: KernelDeclaration, case) -> str:
    """The precision a case is judged at: the declared compute precision
    for a bfloat16-input case, else the contract's."""
    if getattr(case, "dtype", None) == "bfloat16":
        return declaration.supports.compute_precision
    return CONTRACT_PRECISION


def case_type_needs(case_type) -> Tuple[str, ...]:
    """What every case of this type asks, whatever its fields (case_needs'
    own entries for it): its op, and for the core op q and k taken as given."""
    from strategies.cases import MixerCase
    return ("mixer",) if issubclass(case_type, MixerCase) else ("core", "qk_norm:core")


def case_needs(case) -> Tuple[str, ...]:
    """What one case asks of the target: its op (the mixer, or the core op),
    activation dtype, chunk size, QK norm (none inside the core op; the
    mixer's own), beta = 1, GVA, a scale= other than the default, packed
    rows and (core op) an initial state."""
    from strategies.cases import MixerCase
    mixer = isinstance(case, MixerCase)
    needs = ["mixer" if mixer else "core"]
    needs += [f"dtype:{case.dtype}", f"chunk_size:{case.chunk}"]
    needs.append("qk_norm:" + ((repr(case.eps) if case.use_qk_norm else "off") if mixer
                               else "core"))
    if case.beta_regime == "one":
        needs.append("saturated_beta")
    if case.group > 1:
        needs.append("gva")
    if case.scale is not None:
        needs.append("scale")
    if case.segments:
        needs.append("segment_ids")
    if not isinstance(case, MixerCase) and case.has_initial_state:
        needs.append("initial_state")
    return tuple(needs)
