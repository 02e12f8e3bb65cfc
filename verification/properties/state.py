"""Carried state, chunked prefill and decode (docs/contract.md section 7): a
row cut into calls that hand the GDNState on equals one call (outputs, final
state and every gradient, the incoming state's included), decode steps are a
recurrent path compiled once, a bfloat16 decode loop does not drift beyond
what the same-precision reference makes, and state gradients match the
float64 oracle."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from gdn_kernels import GDNState
from strategies import lattice, mixer_cases
from strategies.cases import MixerCase, replace
from strategies.state import DECODE_LOOP_STEPS, decode_steps, incoming_state, pieces

from ..engine import runners
from ..engine.registry import prop, tensor_not_checkable_row
from ..targets.declaration import INCOMING_CONV_STATE_IGNORED
from ..tolerance import compare_handoff, compare_self, compare_to_oracle, structural_row
from .common import (BFLOAT16, GVA, ONE_TOKEN, PACKED, PAST_A_CHUNK, at_declared_precision,
                     dtype_of)

STATE_OUTPUTS = ("o", "conv", "recurrent")
# Gradients summed over tokens: their terms cancel, so the summation order a
# split changes moves them by more than their terms' rounding (measured
# 2.0e-6 relative on ddt_bias of a correct split, at the handoff bound); they
# are judged by the metamorphic kernel-vs-kernel bound (tolerance.DTYPES
# self_bound), every other tensor by the handoff bound.
REDUCED_GRADIENTS = ("conv_weight", "a_log", "dt_bias")


def tensor_dtype(case: MixerCase, name: str) -> str:
    """Policy dtype of an output or gradient of run_pieces (the recurrent
    state and its cotangent are float32; the conv state is in x's dtype)."""
    name = name[1:] if name.startswith("d") and name != "dt_bias" else name
    if name in ("recurrent", "state.recurrent"):
        return "float32"
    if name in ("conv", "state.conv", "o"):
        return case.dtype
    return dtype_of(case, name)


def _splittable(geo) -> bool:
    return lattice.seq_len(geo["length"], geo["chunk"]) >= 2


def _no_time_params(geo) -> bool:
    """a_log / dt_bias without a T axis (a decode loop lengthens the row)."""
    return "T" not in geo["a_log"] and "T" not in geo["dt_bias"]


def _rows_vs_oracle(case, cut, label, inputs, state):
    """The pieces' outputs and gradients against the float64 oracle's one
    call, bounded by the same-precision reference's error."""
    oracle = runners.oracle_fn("mixer")
    one = pieces(case, "one")
    o_out, o_grads = runners.run_pieces(oracle, case, inputs, state, one, x64=True)
    r_out, r_grads = runners.run_pieces(oracle, case, inputs, state, one)
    d_out, d_grads = at_declared_precision(lambda p: runners.run_pieces(
        runners.reference_fn("mixer", p), case, inputs, state, one)) or ({}, {})
    k_out, k_grads = cut
    rows = [compare_to_oracle(f"{n} ({label})", k_out[n], o_out[n], r_out[n],
                              tensor_dtype(case, n), d_out.get(n)) for n in STATE_OUTPUTS]
    rows += [compare_to_oracle("d" + n, k_grads[n], o_grads[n], r_grads[n],
                               tensor_dtype(case, "d" + n), d_grads.get(n)) for n in k_grads]
    return rows


def _handoff_rows(target, case: MixerCase, kind: str, label: str):
    """Pieces vs one call of the same target (handoff bound), and the pieces
    vs the float64 oracle."""
    runners.within_limits(target, case, pieces(case, kind))
    inputs, state = runners.case_inputs(case), incoming_state(case)
    fn = runners.target_fn(target, "mixer")
    w_out, w_grads = runners.run_pieces(fn, case, inputs, state, pieces(case, "one"))
    cut = runners.run_pieces(fn, case, inputs, state, pieces(case, kind))
    c_out, c_grads = cut
    rows = [compare_handoff(f"{n} ({label} vs one call)", c_out[n], w_out[n],
                            tensor_dtype(case, n)) for n in STATE_OUTPUTS]
    for n in c_grads:
        compare = compare_self if n in REDUCED_GRADIENTS else compare_handoff
        rows.append(compare(f"d{n} ({label} vs one call)", c_grads[n], w_grads[n],
                            tensor_dtype(case, "d" + n)))
    return rows + _rows_vs_oracle(case, cut, label, inputs, state)


# The edge classes of the carried state a split reaches, measured on its two
# calls (both start from a non-zero state: the case's incoming one, then the
# first call's): a one-token first call; a call shorter than the conv window
# (1 < T < K-1: its returned conv state keeps K-1-T slots of the history it
# was handed), or of exactly K-1 (its conv state none of the history); a first
# call ending on a chunk edge, under ordinary decay (where
# no decay acts, or the next token's strong decay erases the state handed on,
# a decay misapplied at the edge shows nothing); a one-token last call.
SPLIT_COVERS = {
    "T1=1": lambda c: pieces(c, "split")[0] == 1,
    "a call of 1<T<K-1 tokens after a non-zero history":
        lambda c: any(1 < t < c.conv_width - 1 for t in pieces(c, "split")),
    "a call of exactly K-1 tokens (its conv state all its own inputs)":
        lambda c: any(t == c.conv_width - 1 for t in pieces(c, "split")),
    "T1=C, ordinary decay": lambda c: (pieces(c, "split")[0] == c.chunk
                                       and c.gate_regime == "ordinary"),
    "T2=1": lambda c: pieces(c, "split")[1] == 1,
}


# Weights: each example runs four programs (the pieces and one call of the
# target, the float64 oracle, the same-precision reference), and a new split
# is a new program; a quarter of the profile's examples keeps the state family's
# share of the gate's time near the packing family's.
@prop("mixer_split_invariance", family="state", strategy=mixer_cases(where=_splittable),
      wrong_target="gdn_mutant_conv_state_from_outputs:xla", weight=0.25,
      needs=("carried_state", "incoming_conv_state"),
      covers={**SPLIT_COVERS, "bfloat16": BFLOAT16,
              "K=4": lambda c: c.conv_width == 4},
      on_sharded_target=True)
def mixer_split_invariance(target, case: MixerCase):
    """Two calls x[:, :T1], x[:, T1:] chaining the GDNState equal one call:
    outputs, final conv and recurrent state, and the gradient of one loss
    over both calls (inputs and incoming state); both match the oracle."""
    t1 = pieces(case, "split")[0]
    return _handoff_rows(target, case, "split", f"split {t1}+{case.seq_len - t1}")


def _near_zero_on_decode_tokens(case: MixerCase) -> MixerCase:
    """The case with its (near-)zero q/k rows moved onto the decode tokens,
    so that the single-token calls normalise near-zero rows."""
    n, t = decode_steps(case), case.seq_len
    rows = tuple(dataclasses.replace(r, token=t - 1 - i % n)
                 for i, r in enumerate(case.near_zero))
    return replace(case, near_zero=rows)


@prop("prompt_then_decode", family="state",
      strategy=mixer_cases(where=_splittable, near_zero=True),
      wrong_target="gdn_mutant_decode_without_decay:xla", weight=0.25,
      needs=("carried_state", "incoming_conv_state"),
      covers={"bfloat16": BFLOAT16,
              "several decode steps": lambda c: decode_steps(c) >= 3,
              "exact-zero row": lambda c: any(r.magnitude == 0 for r in c.near_zero),
              "tiny row": lambda c: any(r.magnitude > 0 for r in c.near_zero)})
def prompt_then_decode(target, case: MixerCase):
    """A prompt of T-N tokens then N single-token calls (decode steps, with
    near-zero q/k rows among them) equal one call over all T tokens, and
    match the oracle."""
    case = _near_zero_on_decode_tokens(case)
    return _handoff_rows(target, case, "decode", f"prompt {case.seq_len - decode_steps(case)}"
                         f" + {decode_steps(case)} steps")


@prop("state_gradient_parity", family="state",
      strategy=st.one_of(mixer_cases(), mixer_cases(packed=True)),
      wrong_target="gdn_mutant_incoming_state_gradient_dropped:xla", weight=0.25,
      needs=("carried_state",),
      covers={"packed": PACKED, "bfloat16": BFLOAT16,
              "T=1": ONE_TOKEN, "T=C+1 or longer": PAST_A_CHUNK},
      on_sharded_target=True)
def state_gradient_parity(target, case: MixerCase):
    """One call from a non-zero incoming GDNState, with cotangents on o and
    on the returned state: outputs, returned state and the gradients of
    every input and of state.conv / state.recurrent match the float64
    oracle (packed rows included: only the first document continues it).
    A target that ignores the incoming conv state (Supports) is called from
    a zero conv history, and the gradient of that history is not checkable."""
    runners.within_limits(target, case)
    inputs, state = runners.case_inputs(case), incoming_state(case)
    uses_conv_history = target.declaration.supports.incoming_conv_state
    if not uses_conv_history:
        state = dict(state, conv=np.zeros_like(state["conv"]))
    cut = runners.run_pieces(runners.target_fn(target, "mixer"), case, inputs, state,
                             pieces(case, "one"))
    rows = _rows_vs_oracle(case, cut, "one call", inputs, state)
    if uses_conv_history:
        return rows
    return [tensor_not_checkable_row(r.name, INCOMING_CONV_STATE_IGNORED)
            if r.name == "dstate.conv" else r for r in rows]


# ------------------------------------------------------------ decode loops

def decode_loop(target, case: MixerCase, steps: int, stop_at_recompile: bool = False):
    """A prompt call over the case's T tokens, then `steps` single-token
    calls from Python as a serving loop makes them (public API, each call
    feeding the returned state back). Returns (o [B, T+steps, Hv, Dv],
    final GDNState, the long case, its inputs, the incoming state, compiles
    after the first decode step). stop_at_recompile: end the loop at the
    first decode step after the first that compiled (a recompiling target
    fails after two steps instead of compiling all of them)."""
    long = replace(case, seq_len=case.seq_len + steps, near_zero=())
    runners.within_limits(target, case, (1,))
    inputs, state = runners.case_inputs(long), incoming_state(case)
    kw = dict(runners.mixer_static(case))
    fn = runners.target_fn(target, "mixer")
    arr = {n: jnp.asarray(v) for n, v in inputs.items()}
    st_ = GDNState(jnp.asarray(state["conv"]), jnp.asarray(state["recurrent"]))
    t = case.seq_len

    def call(t0, t1, s):
        return fn(arr["x"][:, t0:t1], arr["conv_weight"], arr["a"][:, t0:t1],
                  arr["b"][:, t0:t1], arr["a_log"], arr["dt_bias"], state=s,
                  return_state=True, **kw)

    o, st_ = call(0, t, st_)
    outs, compiles_after_first = [o], None
    for i in range(steps):
        o, st_ = call(t + i, t + i + 1, st_)
        outs.append(o)
        if i == 0:
            compiles_after_first = runners.compile_count()
        elif stop_at_recompile and runners.compile_count() > compiles_after_first:
            break
    extra = runners.compile_count() - compiles_after_first
    return (np.concatenate([np.asarray(u) for u in outs], axis=1), st_, long, inputs,
            state, extra)


def _decode_case(geo) -> bool:
    return _no_time_params(geo) and geo["dtypes"] == ("bfloat16", "float32")


@prop("decode_drift", family="state", strategy=mixer_cases(where=_decode_case),
      wrong_target="gdn_mutant_state_downcast_between_calls:xla", weight=0.15,
      needs=("carried_state", "incoming_conv_state"),
      covers={"strong decay": lambda c: c.gate_regime == "strong_decay"})
def decode_drift(target, case: MixerCase):
    """bfloat16 activations, float32 state: a prompt then 256 decode steps
    stay within the bound the same-precision reference makes against the
    float64 oracle over the whole row (outputs and final state)."""
    o, st_, long, inputs, state, _ = decode_loop(target, case, DECODE_LOOP_STEPS)
    oracle = runners.oracle_fn("mixer")
    one = pieces(long, "one")
    o_out, _ = runners.run_pieces(oracle, long, inputs, state, one, x64=True)
    r_out, _ = runners.run_pieces(oracle, long, inputs, state, one)
    d_out, _ = at_declared_precision(lambda p: runners.run_pieces(
        runners.reference_fn("mixer", p), long, inputs, state, one)) or ({}, {})
    kernel = {"o": o, "conv": np.asarray(st_.conv), "recurrent": np.asarray(st_.recurrent)}
    label = f"{DECODE_LOOP_STEPS} decode steps"
    return [compare_to_oracle(f"{n} ({label})", kernel[n], o_out[n], r_out[n],
                              tensor_dtype(long, n), d_out.get(n)) for n in STATE_OUTPUTS]


@prop("decode_compiles_once", family="state",
      strategy=mixer_cases(where=_no_time_params, near_zero=False),
      wrong_target="verification.fixture_kernels.wrong_targets.recompiling_decode", weight=0.1,
      needs=("carried_state", "xla_programs"),
      covers={"bfloat16": BFLOAT16, "GVA": GVA})
def decode_compiles_once(target, case: MixerCase):
    """A decode loop of 256 single-token calls compiles nothing after its
    first step: one program serves every step of a shape."""
    *_, extra = decode_loop(target, case, DECODE_LOOP_STEPS, stop_at_recompile=True)
    return [structural_row(f"compiles in decode steps 2..{DECODE_LOOP_STEPS}", extra == 0,
                           f"{extra} compiles after the first decode step")]
