"""Packed sequences and padding (docs/contract.md section 6): documents run
packed equal the same documents run alone, padding is invisible wherever it
sits and gets exactly-zero cotangents, the packed op matches the float64
oracle, and segment_ids are traced data (one compile for every layout)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from strategies import delta_rule_cases, documents, mixer_cases, segment_ids_of
from strategies.cases import DeltaRuleCase, MixerCase, replace
from strategies.segments import layouts_from_ids, padding_mask

from ..engine import runners
from ..engine.registry import prop, shape_claim, tensor_not_checkable_row
from ..tolerance import compare_self, structural_row
from .common import BFLOAT16, GVA, PAST_A_CHUNK, dtype_of, parity_rows

# Inputs with a token axis (axis 1 is T) and the per-token cotangents that
# must be exactly 0 at padding.
TOKEN_INPUTS = ("q", "k", "v", "g", "beta", "x", "a", "b")
PARAMS = ("a_log", "dt_bias")

PACKED_COVERS = {
    "strong decay": lambda c: c.gate_regime == "strong_decay",
    "bfloat16": BFLOAT16,
    "GVA": GVA,
    "T=C+1 or longer": PAST_A_CHUNK,
    "all-padding row": lambda c: any(all(i == 0 for i, _ in row) for row in c.segments),
    "several documents": lambda c: any(len(documents(r)) > 1 for r in segment_ids_of(c)),
}
MIXER_PACKED_COVERS = {
    **PACKED_COVERS,
    "[B,T,Hv] a_log": shape_claim(lambda c: len(c.a_log_shape) == 3
                                  and c.a_log_shape[1] == c.seq_len > 1),
    "[B,Hv] dt_bias": shape_claim(lambda c: len(c.dt_bias_shape) == 2
                                  and c.dt_bias_shape[0] == c.batch > 1),
}


def _docs(case) -> List[Tuple[int, np.ndarray]]:
    """(row, token indices) of every document of a packed case, in order."""
    ids = segment_ids_of(case)
    return [(b, d) for b in range(case.batch) for d in documents(ids[b])]


def padding_rows(case, grads) -> list:
    """Every cotangent of a token input (and of a [B, T, Hv] parameter) is
    exactly 0.0 at every padding token."""
    pad = padding_mask(segment_ids_of(case))
    rows = []
    for name, grad in grads.items():
        token_param = name in PARAMS and grad.ndim == 3 and grad.shape[:2] == pad.shape
        if name in TOKEN_INPUTS or token_param:
            at_pad = np.asarray(grad)[pad]
            ok = bool(np.all(at_pad == 0))
            rows.append(structural_row(f"d{name} at padding", ok,
                                       f"max |d{name}| at padding "
                                       f"{np.max(np.abs(at_pad.astype(np.float64))) if at_pad.size else 0:.3e}"))
    return rows


def pad_output_rows(case, outputs) -> list:
    """The output row of every padding token is exactly 0.0."""
    pad = padding_mask(segment_ids_of(case))
    o = np.asarray(outputs[0])[pad]
    return [structural_row("o at padding", bool(np.all(o == 0)), "non-zero output at padding")]


# --------------------------------------------------------------------------
# documents alone: every document of a packed case as one row of a batch
# --------------------------------------------------------------------------

def _batch_size(n_docs: int) -> int:
    """Documents run alone are batched to the next power of two (dummy rows
    are all zero): few distinct shapes, so few compiles."""
    return 1 << max(0, (n_docs - 1).bit_length())


def _param_rank3(x: np.ndarray) -> np.ndarray:
    return x[None, None] if x.ndim == 1 else (x[:, None] if x.ndim == 2 else x)


def _alone_param(p: np.ndarray, docs, rows: int, seq_len: int) -> np.ndarray:
    """A [Hv] / [B', Hv] / [B', T', Hv] parameter for the documents-alone
    batch: broadcast axes stay, a batch axis takes each document's row, a
    time axis each document's tokens (left-aligned)."""
    p3 = _param_rank3(p)
    if p3.shape[0] == 1 and p3.shape[1] == 1:
        return p
    out = np.zeros((rows if p3.shape[0] > 1 or p3.shape[1] > 1 else 1,
                    seq_len if p3.shape[1] > 1 else 1, p3.shape[2]), p.dtype)
    for i, (b, d) in enumerate(docs):
        src = p3[b if p3.shape[0] > 1 else 0]
        out[i, :len(d)] = src[d] if p3.shape[1] > 1 else src
    return out.reshape((rows, p3.shape[2])) if p.ndim == 2 else out


def _packed_param_grad(grad_alone: np.ndarray, shape, docs) -> np.ndarray:
    """Map a documents-alone parameter gradient back to the packed
    parameter's shape (summing what the packed run sums)."""
    g3 = _param_rank3(grad_alone).astype(np.float64)
    target = np.zeros(_param_rank3(np.zeros(shape)).shape)
    if g3.shape[0] == 1 and g3.shape[1] == 1 and target.shape[:2] == (1, 1):
        return grad_alone.astype(np.float64).reshape(shape)
    for i, (b, d) in enumerate(docs):
        row = b if target.shape[0] > 1 else 0
        if target.shape[1] > 1:
            target[row, d] += g3[i, :len(d)]
        else:
            target[row, 0] += g3[i, 0]
    return target.reshape(shape)


def _alone_inputs(case, inputs, docs, rows):
    """Inputs of the documents-alone batch: document i in row i, tokens
    left-aligned, right-padded with zeros (identity steps of the
    recurrence; after the document, so the causal conv cannot see them);
    the first document of a packed row takes its incoming state."""
    first_docs = {}
    for i, (b, _) in enumerate(docs):
        first_docs.setdefault(b, i)
    out = {}
    for name, x in inputs.items():
        if name in TOKEN_INPUTS:
            alone = np.zeros((rows, case.seq_len) + x.shape[2:], x.dtype)
            for i, (b, d) in enumerate(docs):
                alone[i, :len(d)] = x[b, d]
            out[name] = alone
        elif name == "initial_state":
            alone = np.zeros((rows,) + x.shape[1:], x.dtype)
            for b, i in first_docs.items():
                alone[i] = x[b]
            out[name] = alone
        elif name in PARAMS:
            out[name] = _alone_param(x, docs, rows, case.seq_len)
        else:
            out[name] = x
    return out


def _alone_cotangents(case, cts, docs, rows):
    """Output cotangents of the documents-alone batch: each document's rows
    of the packed o cotangent; the final-state cotangent of a packed row
    goes to its last document (earlier documents' states are discarded)."""
    ct_o = np.zeros((rows,) + cts[0].shape[1:], np.float32)
    last_docs = {}
    for i, (b, d) in enumerate(docs):
        ct_o[i, :len(d)] = cts[0][b, d]
        last_docs[b] = i
    if len(cts) == 1:
        return (ct_o,)
    ct_s = np.zeros((rows,) + cts[1].shape[1:], np.float32)
    for b, i in last_docs.items():
        ct_s[i] = cts[1][b]
    return ct_o, ct_s


def _gather_docs(x, docs, packed: bool) -> np.ndarray:
    """Every document's token rows, concatenated: x[b, d] (packed) or
    x[i, :len(d)] (documents alone)."""
    parts = [x[b, d] if packed else x[i, :len(d)] for i, (b, d) in enumerate(docs)]
    return np.concatenate(parts) if parts else np.zeros((0,) + x.shape[2:], x.dtype)


def _empty_row_rows(case, inputs, out, grads, cts) -> list:
    """A row with no document returns its incoming state bit for bit, and
    the state's cotangent passes straight through."""
    ids = segment_ids_of(case)
    empty = [b for b in range(case.batch) if not np.any(ids[b])]
    if not empty or not isinstance(case, DeltaRuleCase):
        return []
    s0 = inputs.get("initial_state")
    s0 = np.zeros_like(out[1]) if s0 is None else s0.astype(np.float32)
    same = all(np.array_equal(out[1][b], s0[b]) for b in empty)
    rows = [structural_row("final_state of empty rows", same, "not the incoming state")]
    if "initial_state" in grads:
        ct = cts[1].astype(np.float32)
        rows.append(compare_self("dinitial_state of empty rows", grads["initial_state"][empty],
                                 ct[empty].astype(grads["initial_state"].dtype), "float32"))
    return rows


def _separate_rows(target, case) -> list:
    inputs = runners.case_inputs(case)
    cts = tuple(c.astype(np.float32) for c in runners.cotangents(case))
    fn = runners.target_fn(target, runners.case_op(case))
    out, grads = runners.run_vjp(fn, case, inputs, cts)
    docs = _docs(case)
    rows = _empty_row_rows(case, inputs, out, grads, cts)
    if not docs:
        return rows
    n = _batch_size(len(docs))
    alone_case = replace(case, batch=n, segments=(),
                         **({"a_log_shape": _alone_param(inputs["a_log"], docs, n, case.seq_len).shape,
                             "dt_bias_shape": _alone_param(inputs["dt_bias"], docs, n,
                                                           case.seq_len).shape}
                            if isinstance(case, MixerCase) else {}))
    alone_in = _alone_inputs(case, inputs, docs, n)
    a_out, a_grads = runners.run_vjp(fn, alone_case, alone_in,
                                     _alone_cotangents(case, cts, docs, n))
    rows.append(compare_self("o", _gather_docs(a_out[0], docs, False),
                             _gather_docs(out[0], docs, True), case.dtype))
    if isinstance(case, DeltaRuleCase):
        last = {b: i for i, (b, _) in enumerate(docs)}
        rows.append(compare_self("final_state", a_out[1][list(last.values())],
                                 out[1][list(last)], "float32"))
    for name, grad in grads.items():
        if name in TOKEN_INPUTS:
            alone, packed = (_gather_docs(a_grads[name], docs, False),
                             _gather_docs(grad, docs, True))
        elif name == "initial_state":
            first = {}
            for i, (b, _) in enumerate(docs):
                first.setdefault(b, i)
            alone, packed = a_grads[name][list(first.values())], grad[list(first)]
        elif name in PARAMS:
            alone, packed = _packed_param_grad(a_grads[name], grad.shape, docs), grad
        else:
            alone, packed = a_grads[name], grad
        rows.append(compare_self(f"d{name}", alone, packed, dtype_of(case, name)))
    return rows + padding_rows(case, grads) + pad_output_rows(case, out)


def _no_batch_shared_time_params(geo) -> bool:
    """[1, T, Hv] parameters are shared by rows whose tokens move
    differently: leave them to the parity properties."""
    return "[1,T,Hv]" not in (geo.get("a_log"), geo.get("dt_bias"))


@prop("packed_equals_separate", family="packing",
      strategy=delta_rule_cases(packed=True), weight=0.5, needs=("segment_ids",),
      wrong_target="gdn_mutant_reset_only_at_chunk_edges:xla", covers=PACKED_COVERS)
def packed_equals_separate(target, case: DeltaRuleCase):
    """gated_delta_rule on a packed row equals each document run alone (the
    row's first document from the incoming state): outputs, final state
    and every gradient; padding outputs and cotangents exactly 0."""
    return _separate_rows(target, case)


@prop("mixer_packed_equals_separate", family="packing",
      strategy=mixer_cases(packed=True), weight=0.5, needs=("segment_ids",),
      wrong_target="gdn_mutant_conv_window_crosses_documents:xla",
      covers=MIXER_PACKED_COVERS)
def mixer_packed_equals_separate(target, case: MixerCase):
    """gdn_decoupled_conv1d on a packed row equals each document run alone:
    outputs and the gradients of x, a, b, conv_weight, a_log, dt_bias (the
    conv window never crosses a document or reads padding)."""
    return _separate_rows(target, case)


# --------------------------------------------------------------------------
# padding anywhere: the same documents with the padding moved to the end
# --------------------------------------------------------------------------

def _compact_order(ids: np.ndarray) -> np.ndarray:
    """Per row, the token order that moves every padding token to the end
    (documents keep their order): [B, T] indices."""
    return np.argsort(ids == 0, axis=1, kind="stable")


def _garbage_padding(inputs, ids, seed: int) -> Dict[str, np.ndarray]:
    """inputs with every padding token's values replaced by large random
    values (the contract says padding values never matter)."""
    rng = np.random.default_rng([seed, 104729])
    pad = padding_mask(ids)
    out = dict(inputs)
    for name in TOKEN_INPUTS:
        if name in inputs:
            x = np.array(inputs[name])
            noise = 100.0 * rng.standard_normal(x.shape)
            if name == "g":
                noise = -np.abs(noise)
            x[pad] = noise[pad].astype(x.dtype)
            out[name] = x
    return out


def _along_time(x, order) -> np.ndarray:
    """x [B, T, ...] reordered along time: out[b, p] = x[b, order[b, p]]."""
    return np.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)


def _has_token_axis(name, x, ids) -> bool:
    """A token input, or a [B, T, Hv] parameter."""
    return name in TOKEN_INPUTS or (name in PARAMS and x.ndim == 3 and
                                    x.shape[:2] == ids.shape)


def _permuted(named, order) -> Dict[str, np.ndarray]:
    """Every tensor with a token axis reordered along time; the rest as is."""
    return {n: _along_time(x, order) if _has_token_axis(n, x, order) else x
            for n, x in named.items()}


@prop("padding_transparency", family="packing",
      strategy=mixer_cases(packed=True, where=_no_batch_shared_time_params), weight=0.25,
      needs=("segment_ids",),
      wrong_target="gdn_mutant_conv_ignores_padding:xla", covers=MIXER_PACKED_COVERS)
def padding_transparency(target, case: MixerCase):
    """Moving every padding token to the end of its row (documents and their
    order unchanged, padding values random and large) changes no
    non-padding output and no gradient; padding outputs and every padding
    cotangent are exactly 0 in both layouts."""
    ids = segment_ids_of(case)
    order = _compact_order(ids)
    inputs = _garbage_padding(runners.case_inputs(case), ids, case.seed)
    moved_ids = np.take_along_axis(ids, order, axis=1)
    moved_case = replace(case, segments=layouts_from_ids(moved_ids))
    moved_inputs = _garbage_padding(_permuted(inputs, order), moved_ids,
                                    case.seed + 1)
    (ct,) = (c.astype(np.float32) for c in runners.cotangents(case))
    fn = runners.target_fn(target, "mixer")
    out, grads = runners.run_vjp(fn, case, inputs, (ct,))
    m_out, m_grads = runners.run_vjp(fn, moved_case, moved_inputs, (_along_time(ct, order),))
    inverse = np.argsort(order, axis=1)
    real = ~padding_mask(ids)
    rows = [compare_self("o (real tokens)", _along_time(m_out[0], inverse)[real],
                         out[0][real], case.dtype)]
    for name, grad in grads.items():
        moved = _permuted({name: m_grads[name]}, inverse)[name]
        if _has_token_axis(name, grad, ids):
            moved, grad = moved[real], grad[real]
        rows.append(compare_self(f"d{name}", moved, grad, dtype_of(case, name)))
    return (rows + padding_rows(case, grads) + padding_rows(moved_case, m_grads)
            + pad_output_rows(case, out) + pad_output_rows(moved_case, m_out))


# --------------------------------------------------------------------------
# parity with the oracle, None == all-ones, one compile for every layout
# --------------------------------------------------------------------------

@prop("packed_gradient_parity", family="packing",
      strategy=delta_rule_cases(packed=True), weight=0.5, needs=("segment_ids",),
      wrong_target="gdn_mutant_doc_tail_padded_with_zeros:xla",
      covers=PACKED_COVERS,
      on_sharded_target=True)
def packed_gradient_parity(target, case: DeltaRuleCase):
    """Packed gated_delta_rule: outputs, final state and every gradient vs
    the float64 oracle (which runs the deletion definition token by token);
    padding cotangents exactly 0."""
    return parity_rows(target, case, with_grads=True) + _padding_of_target(target, case)


@prop("mixer_packed_gradient_parity", family="packing",
      strategy=mixer_cases(packed=True), weight=0.5, needs=("segment_ids",),
      wrong_target="gdn_mutant_conv_ignores_padding:xla",
      covers=MIXER_PACKED_COVERS,
      on_sharded_target=True)
def mixer_packed_gradient_parity(target, case: MixerCase):
    """Packed gdn_decoupled_conv1d: output and every gradient (a_log,
    dt_bias of every rank, strong decay included) vs the float64 oracle;
    padding outputs and cotangents exactly 0."""
    return parity_rows(target, case, with_grads=True) + _padding_of_target(target, case)


def _padding_of_target(target, case) -> list:
    out, grads = runners.target_vjp(target, case)
    return padding_rows(case, grads) + pad_output_rows(case, out)


@prop("segment_ids_are_data", family="packing",
      strategy=delta_rule_cases(packed=True), weight=0.25, needs=("segment_ids",),
      wrong_target="gdn_mutant_padding_id_off_by_one:xla",
      covers={"padding": lambda c: any(i == 0 for row in c.segments for i, _ in row),
              "several documents": PACKED_COVERS["several documents"]})
def segment_ids_are_data(target, case: DeltaRuleCase):
    """segment_ids=None and all-ones ids agree (outputs and gradients), and
    a second layout of the same shape runs without a new compile (not
    checkable where the kernel is bridged from another framework)."""
    inputs = runners.case_inputs(case)
    ones = replace(case, segments=tuple(((1, case.seq_len),) for _ in range(case.batch)))
    plain_out, plain_grads = runners.target_vjp(target, replace(case, segments=()), inputs)
    ones_out, ones_grads = runners.target_vjp(target, ones, inputs)
    rows = [compare_self(n, a, b, dtype_of(case, n))
            for n, a, b in zip(runners.output_names(case), ones_out, plain_out)]
    rows += [compare_self("d" + n, ones_grads[n], plain_grads[n], dtype_of(case, n))
             for n in inputs]
    compiles_unseen = target.not_checkable(("xla_programs",))
    if compiles_unseen:
        return rows + [tensor_not_checkable_row("compiles for a new layout", compiles_unseen)]
    before = runners.compile_count()
    runners.target_vjp(target, case, inputs)
    compiles = runners.compile_count() - before
    rows.append(structural_row("compiles for a new layout", compiles == 0,
                               f"{compiles} compiles for a layout change of the same shape"))
    return rows
