"""The sweep's on-disk state: its configuration and one JSON line per evaluation.

``DIR/sweep.json`` holds the configuration that defines a sweep (model, cluster, space, objective,
optimizer, seed); ``DIR/evaluations.jsonl`` gets one line per finished evaluation, flushed and
fsync'ed before the sweep moves on, so a killed sweep loses at most the evaluations in flight. A
torn last line (killed mid-write) is ignored on load. Resuming replays the same deterministic
search and takes every result already on disk instead of evaluating it again.

The lines are :class:`~mindpipe.tuner.records.EvaluationRecord` objects (state version 2: status
and reason codes, the plan as a Plan document). A store written by another version is refused
with one line: its records are another format, and its default space searched what-if knobs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mindpipe.traces.errors import ContractError
from mindpipe.tuner.records import EvaluationRecord

CONFIG_NAME = "sweep.json"
RECORDS_NAME = "evaluations.jsonl"
# 2: typed records with reason codes; the default space pins the what-if knobs (state 1 did not).
STATE_VERSION = 2


class SweepStore:
    """Evaluations of one sweep, keyed by point key, persisted as they arrive."""

    def __init__(self, out_dir: str | os.PathLike[str], config: dict[str, Any], resume: bool) -> None:
        """Open (or create) the store in ``out_dir``.

        Args:
            out_dir: The sweep's output directory.
            config: What defines the sweep; must equal the stored one to resume (budget,
                workers and executor may change).
            resume: Continue a sweep found in ``out_dir``; without it an existing sweep is an error.

        Raises:
            ContractError: ``out_dir`` holds a different sweep, or a sweep while ``resume`` is off.
        """
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / CONFIG_NAME
        self.records_path = self.dir / RECORDS_NAME
        self.records: dict[str, EvaluationRecord] = {}
        self.order: list[str] = []
        stored = {"state_version": STATE_VERSION, **config}
        if self.config_path.exists():
            if not resume:
                raise ContractError(str(self.dir), None, "already holds a sweep: pass --resume to continue it, "
                                    "or choose another --out")
            try:
                old = json.loads(self.config_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ContractError(str(self.config_path), None, f"malformed JSON: {e.msg}") from None
            version = old.get("state_version") if isinstance(old, dict) else None
            if version != STATE_VERSION:
                raise ContractError(str(self.config_path), "state_version", (
                    f"state_version={version} was written by another version of mindpipe tune (this one reads "
                    f"{STATE_VERSION}); start the sweep again in a new --out"))
            diff = sorted(k for k in set(old) | set(stored) if old.get(k) != stored.get(k))
            if diff:
                raise ContractError(str(self.config_path), diff[0],
                                    f"the stored sweep differs in {', '.join(diff)}; cannot resume it with these arguments")
            self._load()
        else:
            tmp = self.config_path.with_name(CONFIG_NAME + ".tmp")
            tmp.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.config_path)
            self.records_path.write_text("", encoding="utf-8")
        self._fh = self.records_path.open("a", encoding="utf-8")

    def _load(self) -> None:
        if not self.records_path.exists():
            return
        good: list[str] = []
        for line in self.records_path.read_text(encoding="utf-8").splitlines():
            try:
                rec = EvaluationRecord.from_json(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a line torn by a kill (ContractError is a ValueError); that evaluation runs again
            if rec.key not in self.records:
                self.records[rec.key] = rec
                self.order.append(rec.key)
                good.append(line)
        # Rewrite without torn lines so appends start on a clean line.
        tmp = self.records_path.with_name(RECORDS_NAME + ".tmp")
        tmp.write_text("".join(g + "\n" for g in good), encoding="utf-8")
        os.replace(tmp, self.records_path)

    def get(self, key: str) -> EvaluationRecord | None:
        """The stored record of a point, if any."""
        return self.records.get(key)

    def add(self, record: EvaluationRecord) -> None:
        """Persist one evaluation (append, flush, fsync)."""
        key = record.key
        if key in self.records:
            return
        self._fh.write(json.dumps(record.to_json(), separators=(",", ":"), allow_nan=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records[key] = record
        self.order.append(key)

    def close(self) -> None:
        """Close the records file."""
        self._fh.close()

    def __len__(self) -> int:
        return len(self.records)


__all__ = ["CONFIG_NAME", "RECORDS_NAME", "SweepStore"]
