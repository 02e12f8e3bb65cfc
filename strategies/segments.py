"""Packed-sequence layouts (docs/contract.md section 6) as plain data.

A ROW LAYOUT is a tuple of runs ((id, length), ...) whose lengths sum to the
sequence length T; id 0 is a run of padding, a positive id a run of one
document's tokens. A BATCH LAYOUT is a tuple of B row layouts. `segment_ids`
turns a batch layout into the [B, T] int32 array the ops take.

Documents are always read back from the ids by the contract's deletion
definition (`documents`: drop the padding, split where the id changes
between consecutive remaining tokens), never from the runs, so the features
below (LAYOUT_FEATURES) are the ones the kernels see: ids 1,1,0,0,1 are ONE
document, ids 1,2,1 three.

`segment_layouts` draws batch layouts run by run. Each run's length is drawn
from a mix of special lengths (1, K-1, C-1, C, C+1, long) and lengths that
end the run at, one token before or one token after the next chunk edge,
plus a free length, so boundaries land on and around chunk edges without
any rejection.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np
from hypothesis import strategies as st

RowLayout = Tuple[Tuple[int, int], ...]
BatchLayout = Tuple[RowLayout, ...]

MAX_RUNS = 6
# Fresh ids of a row are base, base + 1, ... (or counted down from
# base + MAX_RUNS - 1): small ids, ids far from 1, ids at the int32 limit.
ID_BASES = (1, 1000, 2**31 - MAX_RUNS)

# Row kinds, repeated to weight them (sampled_from draws uniformly; shrinking
# goes to the first: one document without padding).
ROW_KINDS = ("single_document", "runs", "runs", "runs", "runs", "runs", "all_padding")

# How one run's length is chosen: a free length, special lengths relative to
# the conv width K and the chunk size C, or "end the run at the next chunk
# edge + d" for d = -1, 0, +1 (listed twice: drawn twice as often). A length
# that would use up the row is redrawn freely (see _run_length).
RUN_LENGTHS = ("free", "1", "K-1", "C-1", "C", "C+1", "long",
               "to_edge-1", "to_edge", "to_edge+1", "to_edge-1", "to_edge", "to_edge+1")

# What a run holds, by what precedes it: a new document (fresh id), padding,
# the document before the padding again (padding inside a document), or an
# earlier id that is not the last document's (one id in two documents:
# 1,2,1). "reuse" without such an id, or "continue" with no document yet,
# falls back to "new".
FIRST_RUN_LABELS = ("new", "new", "padding")
LABELS_AFTER_DOCUMENT = ("new", "padding", "reuse")
LABELS_AFTER_PADDING = ("continue", "continue", "new", "reuse")


# --- arrays from layouts, documents from arrays ------------------------------

def row_ids(row: RowLayout) -> np.ndarray:
    """The ids of one row layout: int32 [T]."""
    parts = [np.full(length, seg_id, dtype=np.int32) for seg_id, length in row]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def segment_ids(layouts: BatchLayout) -> np.ndarray:
    """The segment_ids array of a batch layout: int32 [B, T] (0 = padding).
    An empty batch layout gives an int32 array of shape [0, 0]."""
    if not layouts:
        return np.zeros((0, 0), np.int32)
    return np.stack([row_ids(row) for row in layouts])


def layouts_from_ids(ids: np.ndarray) -> BatchLayout:
    """Inverse of segment_ids: the runs of equal ids of every row of [B, T]."""
    rows = []
    for row in np.asarray(ids):
        cuts = np.flatnonzero(np.diff(row)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(row)]])
        rows.append(tuple((int(row[a]), int(b - a)) for a, b in zip(starts, ends)))
    return tuple(rows)


def padding_mask(ids: np.ndarray) -> np.ndarray:
    """bool, same shape as ids ([B, T]): True at padding tokens (id 0)."""
    return np.asarray(ids) == 0


def documents(ids_row: np.ndarray) -> List[np.ndarray]:
    """The documents of one row of ids [T], in order, by the deletion
    definition: each is the int64 array of its token indices (ascending).
    [1,1,2,2,1] -> [0,1], [2,3], [4]; [1,1,0,0,1] -> [0,1,4]; [0,0] -> []."""
    ids_row = np.asarray(ids_row)
    kept = np.flatnonzero(ids_row != 0)
    if kept.size == 0:
        return []
    kept_ids = ids_row[kept]
    cuts = np.flatnonzero(kept_ids[1:] != kept_ids[:-1]) + 1
    return np.split(kept, cuts)


# --- drawing layouts ---------------------------------------------------------

def _special_length(kind: str, pos: int, chunk: int, conv_width: int) -> int:
    """The length of a run starting at token `pos` for a fixed RUN_LENGTHS
    kind (not "free" / "long"); it may exceed the tokens left."""
    fixed = {"1": 1, "K-1": max(1, conv_width - 1), "C-1": chunk - 1, "C": chunk,
             "C+1": chunk + 1}
    if kind in fixed:
        return fixed[kind]
    offset = {"to_edge-1": -1, "to_edge": 0, "to_edge+1": 1}[kind]
    end = (pos // chunk + 1) * chunk + offset      # the next chunk edge + offset
    if end <= pos:
        end += chunk
    return end - pos


@st.composite
def _run_length(draw, pos: int, seq_len: int, chunk: int, conv_width: int):
    """The length of a run (not the row's last) starting at token pos:
    1 .. seq_len - pos. A special length that would use up the row is
    replaced by a free one, so short rows still get several runs."""
    left = seq_len - pos
    kind = draw(st.sampled_from(RUN_LENGTHS))
    if kind == "long":
        length = draw(st.integers(chunk + 2, max(chunk + 2, left)))
    elif kind != "free":
        length = _special_length(kind, pos, chunk, conv_width)
    if kind == "free" or length >= left:
        length = draw(st.integers(1, left))
    return length


@st.composite
def _run_lengths(draw, seq_len: int, chunk: int, conv_width: int):
    """2..MAX_RUNS run lengths summing to seq_len (fewer when T runs out);
    the last run takes what is left."""
    n_runs = draw(st.integers(2, MAX_RUNS))
    lengths, pos = [], 0
    for i in range(n_runs):
        if pos == seq_len:
            break
        last = i == n_runs - 1
        length = seq_len - pos if last else draw(_run_length(pos, seq_len, chunk, conv_width))
        lengths.append(length)
        pos += length
    return lengths


def _labels_for(ids) -> Tuple[str, ...]:
    """The labels the next run draws from, given the ids so far."""
    if not ids:
        return FIRST_RUN_LABELS
    return LABELS_AFTER_PADDING if ids[-1] == 0 else LABELS_AFTER_DOCUMENT


@st.composite
def _run_ids(draw, n_runs: int):
    """One id per run (0 = padding), fresh ids counted up or down from a
    drawn base. No two consecutive runs share an id (padding included), so
    layouts come out canonical: runs are maximal."""
    base = draw(st.sampled_from(ID_BASES))
    descending = draw(st.booleans())
    fresh = (lambda i: base + MAX_RUNS - 1 - i) if descending else (lambda i: base + i)
    used, ids = [], []
    for _ in range(n_runs):
        label = draw(st.sampled_from(_labels_for(ids)))
        last_doc = used[-1] if used else None
        others = sorted(set(used) - {last_doc})
        if label == "padding":
            ids.append(0)
            continue
        if label == "continue" and last_doc is not None:
            seg_id = last_doc
        elif label == "reuse" and others:
            seg_id = draw(st.sampled_from(others))
        else:
            seg_id = fresh(len(set(used)))
        used.append(seg_id)
        ids.append(seg_id)
    return ids


@st.composite
def row_layouts(draw, seq_len: int, chunk: int, conv_width: int):
    """One row layout of seq_len tokens: a single document, all padding, or
    2..MAX_RUNS runs of documents and padding (see RUN_LENGTHS and the
    *_LABELS)."""
    kind = draw(st.sampled_from(ROW_KINDS))
    if kind == "single_document":
        return ((draw(st.sampled_from(ID_BASES)), seq_len),)
    if kind == "all_padding":
        return ((0, seq_len),)
    lengths = draw(_run_lengths(seq_len, chunk, conv_width))
    ids = draw(_run_ids(len(lengths)))
    return tuple(zip(ids, lengths))


def segment_layouts(batch: int, seq_len: int, chunk: int, conv_width: int):
    """A batch layout: a tuple of `batch` independent row layouts of seq_len
    tokens each. conv_width K sets the K-1 special length (pass 4 for the
    delta-rule op, which has no conv)."""
    row = row_layouts(seq_len, chunk, conv_width)
    return st.tuples(*([row] * batch))


# --- features (Hypothesis events and the meta-test's reach check) ------------

def _rows_documents(layouts: BatchLayout):
    """Per row: (ids [T], its documents)."""
    out = []
    for row in layouts:
        ids = row_ids(row)
        out.append((ids, documents(ids)))
    return out


def _doc_length(test: Callable[[int, int, int], bool]):
    """Feature: some document's token count n satisfies test(n, C, K)."""
    def feature(layouts, chunk, conv_width):
        return any(test(len(doc), chunk, conv_width)
                   for _, docs in _rows_documents(layouts) for doc in docs)
    return feature


def _boundary(test: Callable[[int, int, int], bool]):
    """Feature: some document after a row's first starts at a token s with
    test(s, C, T) (s is the first token of the later document)."""
    def feature(layouts, chunk, conv_width):
        return any(test(int(doc[0]), chunk, len(ids))
                   for ids, docs in _rows_documents(layouts) for doc in docs[1:])
    return feature


def _row(test: Callable[[np.ndarray, List[np.ndarray]], bool]):
    """Feature: some row's (ids [T], documents) satisfies test."""
    def feature(layouts, chunk, conv_width):
        return any(test(ids, docs) for ids, docs in _rows_documents(layouts))
    return feature


def _padding_inside_a_document(ids, docs) -> bool:
    return any(doc[-1] - doc[0] + 1 != len(doc) for doc in docs)


def _padding_between_documents(ids, docs) -> bool:
    return any(nxt[0] > prev[-1] + 1 for prev, nxt in zip(docs, docs[1:]))


def _repeated_id(ids, docs) -> bool:
    doc_ids = [int(ids[doc[0]]) for doc in docs]
    return len(set(doc_ids)) < len(doc_ids)


LAYOUT_FEATURES: Dict[str, Callable] = {
    "doc length 1": _doc_length(lambda n, c, k: n == 1),
    "doc length K-1": _doc_length(lambda n, c, k: n == k - 1),
    "doc length C-1": _doc_length(lambda n, c, k: n == c - 1),
    "doc length C": _doc_length(lambda n, c, k: n == c),
    "doc length C+1": _doc_length(lambda n, c, k: n == c + 1),
    "doc length > C+1": _doc_length(lambda n, c, k: n > c + 1),
    # s: first token of a document that is not its row's first
    "boundary at a chunk edge": _boundary(lambda s, c, t: s % c == 0),
    "boundary one before a chunk edge": _boundary(lambda s, c, t: (s + 1) % c == 0 and s + 1 < t),
    "boundary one after a chunk edge": _boundary(lambda s, c, t: s % c == 1 and s > 1),
    "boundary inside a chunk": _boundary(lambda s, c, t: s % c not in (0, 1, c - 1)),
    "left padding": _row(lambda ids, docs: ids[0] == 0 and bool(docs)),
    "right padding": _row(lambda ids, docs: ids[-1] == 0 and bool(docs)),
    "padding inside a document": _row(_padding_inside_a_document),
    "padding between documents": _row(_padding_between_documents),
    "all-padding row": _row(lambda ids, docs: not docs),
    "id repeated in two documents": _row(_repeated_id),
    "single document, no padding": _row(lambda ids, docs: len(docs) == 1 and bool(np.all(ids))),
}


def layout_features(layouts: BatchLayout, chunk: int, conv_width: int) -> List[str]:
    """The names of the LAYOUT_FEATURES that hold for a batch layout."""
    return [name for name, holds in LAYOUT_FEATURES.items() if holds(layouts, chunk, conv_width)]
