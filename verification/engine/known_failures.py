"""Known failures of a partial implementation: `--gdn-known-failures FILE`.

One entry a line, fields separated by `|`, `#` starts a comment:

    # property id                | tensor (optional) | reason
    delta_rule_gradient_parity   | dg                | strong-decay dg cancels in float32 (#12)
    packed_equals_separate       |                   | packing lands next release

A failing example whose every failing row is listed (the property alone
lists every row) is a known failure: the property reports XFAIL. An entry
that did not fail in the whole run reports XPASS and fails the run, so the
file cannot go stale silently.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    property: str
    tensor: Optional[str]
    reason: str

    @property
    def label(self) -> str:
        return self.property + (f" / {self.tensor}" if self.tensor else "")

    def matches(self, prop_id: str, row_name: str) -> bool:
        return self.property == prop_id and self.tensor in (None, row_name)


def parse(text: str, source: str = "known-failures file") -> Tuple[KnownFailure, ...]:
    """The entries of the file's text (ValueError naming the line)."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) == 2:
            fields.insert(1, "")
        if len(fields) != 3 or not fields[0] or not fields[2]:
            raise ValueError(f"{source} line {number}: expected 'property | tensor | reason' "
                             f"(the tensor may be empty, the reason may not): {line!r}")
        entries.append(KnownFailure(fields[0], fields[1] or None, fields[2]))
    return tuple(entries)


def load(path: str, known_ids: Iterable[str]) -> Tuple[KnownFailure, ...]:
    """The file's entries; ValueError for a missing file or an unknown property id."""
    try:
        with open(path) as f:
            entries = parse(f.read(), path)
    except OSError as err:
        raise ValueError(f"--gdn-known-failures {path}: {err.strerror}") from None
    known_ids = set(known_ids)
    unknown = sorted({e.property for e in entries} - known_ids)
    if unknown:
        raise ValueError(f"--gdn-known-failures {path}: unknown property id(s) {unknown}")
    return entries


def covering(entries, prop_id: str, failing_rows) -> Optional[List[KnownFailure]]:
    """The entries that cover every failing row (None if a row is not covered)."""
    used = []
    for row in failing_rows:
        match = [e for e in entries if e.matches(prop_id, row.name)]
        if not match:
            return None
        used.extend(e for e in match if e not in used)
    return used
