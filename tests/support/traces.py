"""Trace files and trace scenarios for the tests of the trace workload."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tests.support.labfixtures import REPO

SHIPPED_TRACE = REPO / "fixtures" / "cache_qualify" / "workload" / "data" / "conversations.jsonl"
# the first 1,000 records of Mooncake's conversation trace (its README names the source and license)
MOONCAKE_SLICE = SHIPPED_TRACE.parent / "mooncake" / "conversation_trace.jsonl"

# Lines: 1 name, 2 description, 3 corpus, 4 default, 5 trace, 6 file, 7 block_tokens, 8 trials,
# 9 expectations, 10 the hit rate's gain.
TRACE_SCENARIO = """\
name: replay
description: a trace replayed
corpus:
  default: true
trace:
  file: trace.jsonl
  block_tokens: 16
trials: 4
expectations:
  - {metric: hit_rate, kind: gain, min_effect: 2 pp}
"""


def write_trace(folder: Path, records: Sequence[Mapping[str, object] | str], name: str = "trace.jsonl") -> Path:
    """`records` as JSON Lines (a str is written as the line itself, for lines that are not JSON)."""
    path = folder / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def mooncake(timestamp: float, input_length: int, hash_ids: Sequence[int], output_length: int = 10) -> dict[str, object]:
    """One Mooncake record."""
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
            "hash_ids": list(hash_ids)}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n
