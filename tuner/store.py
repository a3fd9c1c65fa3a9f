"""The sweep's on-disk state: its configuration and one JSON line per evaluation.

``DIR/sweep.json`` holds the configuration that defines a sweep (model, cluster, space, objective,
optimizer, seed); ``DIR/evaluations.jsonl`` gets one line per finished evaluation, flushed and
fsync'ed before the sweep moves on, so a killed sweep loses at most the evaluations in flight. A
torn last line (killed mid-write: no newline after it, not complete JSON) is dropped on load. Resuming replays the
same deterministic search and takes every result already on disk instead of evaluating it again.

The state is created with the first stored evaluation, not before: a sweep that fails before it
evaluates anything (an unreachable ``--dask`` scheduler) leaves nothing that would make the same
command refuse ``--out``. Every file is written through :mod:`mindpipe.traces.atomic`.

The lines are :class:`~mindpipe.tuner.records.EvaluationRecord` objects (state version 2: status
and reason codes, the plan as a Plan document). State that is not this format — written by another
version, truncated, corrupted or from elsewhere — is refused on ``--resume`` with one line naming
the file (and line) and what is wrong, never read past. What the line tells the user to change names
the arguments as the caller does (:class:`~mindpipe.tuner.keys.ArgNames`: ``--out`` or ``out``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import IO, Any

from mindpipe.traces.atomic import open_append, output_dir, write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import SWEEP_STATE, parse_json, read_text
from mindpipe.tuner.keys import CLI_ARG_NAMES, POINT_KEYS, ArgNames, point_key
from mindpipe.tuner.records import EvaluationRecord, Metrics

CONFIG_NAME = "sweep.json"
RECORDS_NAME = "evaluations.jsonl"
# 2: typed records with reason codes; the default space pins the what-if knobs (state 1 did not).
STATE_VERSION = 2
RECORD_KEYS = frozenset({"key", "point", "status", "plan", "code", "simulated", "metrics", "message", "eval_s"})
_METRICS = frozenset(f.name for f in dataclasses.fields(Metrics))

def _changed_by(key: str, n: ArgNames) -> str | None:
    """What a user changes to change ``key`` of a sweep's identity (tuner/api.py _sweep_identity,
    SweepConfig.identity), named as ``n`` names the arguments; None for a key without one."""
    said = {
        "problem": n.either("--model", "--cluster", "--trace", "--calibration"),
        "model": n.name("--model"), "global_batch": f"{n.name('--global-batch')}; its default follows {n.name('--cluster')}",
        "fixes": n.name("--fix"), "partitioners": n.name("--partitioner"), "what_if": n.name("--what-if"),
        "search": n.name("--search"), "objective": n.either("--objective", "--constraint", "the critical batch"),
        "optimizer": n.name("--optimizer"), "seed": n.name("--seed"), "surrogate": n.name("--surrogate"),
        "n_initial": n.name("--initial-points"),
        "batch_size": f"{n.name('--batch-size')}, or {n.name('--workers')} without it",
        "timeshift": n.either("--carbon-csv", "--window", "--job-hours", "--iterations", "--interruptible"),
        "subnets": n.name("--subnets"),
        # Python: the target and where the job may run are two fields; the CLI sets them with several flags
        "target": n.either("--target-samples", "objective.placement") if n.python else "the carbon-to-target flags",
    }
    return said.get(key)


def _start_again(n: ArgNames) -> str:
    """The way out of state that cannot be resumed."""
    return f"start the sweep again in a new {n.name('--out')}"


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _record_problem(data: Any) -> str | None:
    """What makes ``data`` not a record line of this format (None: it is one)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if set(data) != RECORD_KEYS:
        extra, missing = sorted(set(data) - RECORD_KEYS), sorted(RECORD_KEYS - set(data))
        return "not an evaluation record (" + "; ".join(
            ([f"unknown keys {', '.join(extra)}"] if extra else []) + ([f"missing {', '.join(missing)}"] if missing else [])) + ")"
    point, metrics = data["point"], data["metrics"]
    if not isinstance(point, dict) or not set(POINT_KEYS) <= set(point):
        return "point: not a plan point (needs " + ", ".join(POINT_KEYS) + ")"
    if not isinstance(data["key"], str) or data["key"] != point_key(point):
        return "key: does not match its point"
    if not isinstance(metrics, dict) or not set(metrics) <= _METRICS or not all(
            v is None or isinstance(v, bool) or _number(v) for v in metrics.values()):
        return "metrics: expected an object of known metrics with numbers"
    if not isinstance(data["simulated"], bool) or not isinstance(data["message"], str) or not _number(data["eval_s"]) \
            or not math.isfinite(data["eval_s"]):
        return "simulated, message or eval_s has the wrong type"
    return None


def parse_record(line: str, source: str, *, arg_names: ArgNames = CLI_ARG_NAMES) -> EvaluationRecord:
    """One line of ``evaluations.jsonl`` (strict numbers, as the reading layer parses them).

    Raises:
        ContractError: naming ``source`` (file and line): malformed JSON, a number JSON cannot hold
            (a 5,000-digit integer), or not a record of this format (what to do, naming the
            arguments as ``arg_names`` does).
    """
    try:
        data = parse_json(line, source, non_finite=True)  # metrics may hold the NaN/Infinity add() wrote
    except ContractError as e:
        raise ContractError(source, e.key, f"{e.rule}; {_start_again(arg_names)}") from None
    problem = _record_problem(data)
    if problem is None:
        try:
            return EvaluationRecord.from_json(data)
        except ContractError as e:
            problem = f"plan: {e.rule}"
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            problem = f"not an evaluation record ({type(e).__name__}: {e})"
    raise ContractError(source, None, f"{problem}; {_start_again(arg_names)}")


def _read_regular(path: Path, arg_names: ArgNames) -> str:
    """A state file's text through the reading layer: a regular file within the sweep-state limit, UTF-8."""
    try:
        return read_text(path, SWEEP_STATE)
    except ContractError as e:
        raise ContractError(e.source, e.key, f"{e.rule}; {_start_again(arg_names)}") from None


class SweepStore:
    """Evaluations of one sweep, keyed by point key, persisted as they arrive."""

    def __init__(self, out_dir: str | os.PathLike[str], config: dict[str, Any], resume: bool, *,
                 arg_names: ArgNames = CLI_ARG_NAMES) -> None:
        """Open the store in ``out_dir`` (its files are created with the first evaluation).

        Args:
            out_dir: The sweep's output directory.
            config: What defines the sweep; must equal the stored one to resume (budget,
                workers and executor may change).
            resume: Continue a sweep found in ``out_dir``; without it an existing sweep is an error.
            arg_names: How a refusal names what to change (``mindpipe tune``'s flags by default;
                :func:`~mindpipe.tuner.api.tune` passes its own).

        Raises:
            ContractError: ``out_dir`` is not a directory, holds a different sweep, a sweep while
                ``resume`` is off, or state that is not a sweep of this version.
        """
        self.dir = Path(out_dir)
        self.arg_names = arg_names
        n = arg_names
        if os.path.lexists(self.dir):
            output_dir(self.dir)  # refuses a file or a dangling link
        self.config_path = self.dir / CONFIG_NAME
        self.records_path = self.dir / RECORDS_NAME
        self.records: dict[str, EvaluationRecord] = {}
        self.order: list[str] = []
        self._stored = {"state_version": STATE_VERSION, **config}
        self._fh: IO[str] | None = None
        if os.path.lexists(self.config_path):
            if not resume:
                raise ContractError(str(self.dir), None, f"already holds a sweep: pass {n.switched_on('--resume')} "
                                    f"to continue it, or choose another {n.name('--out')}")
            self._check_config()
            self._load()
            self._fh = open_append(self.records_path)
        elif os.path.lexists(self.records_path):
            raise ContractError(str(self.records_path), None, f"evaluations without {CONFIG_NAME}: not a sweep "
                                f"this version can resume; remove it or choose another {n.name('--out')}")

    def _check_config(self) -> None:
        """Refuse to resume a stored sweep whose identity differs from this one's, naming what differs."""
        n = self.arg_names
        old = parse_json(_read_regular(self.config_path, n), str(self.config_path))
        if not isinstance(old, dict):
            raise ContractError(str(self.config_path), None, f"expected a JSON object, got {type(old).__name__}; "
                                f"{_start_again(n)}")
        version = old.get("state_version")
        if version != STATE_VERSION:
            raise ContractError(str(self.config_path), "state_version", (
                f"state_version={version} was written by another version of mindpipe tune (this one reads "
                f"{STATE_VERSION}); {_start_again(n)}"))
        stored = self._stored
        diff = sorted(k for k in set(old) | set(stored) if old.get(k) != stored.get(k))
        if diff:
            named = ", ".join(f"{k} ({why})" if (why := _changed_by(k, n)) else k for k in diff)
            raise ContractError(str(self.config_path), diff[0],
                                f"the stored sweep differs in {named}; cannot resume it with these arguments")

    def _load(self) -> None:
        if not os.path.lexists(self.records_path):
            write_text(self.records_path, "")
            return
        text = _read_regular(self.records_path, self.arg_names)
        lines = text.split("\n")
        last = lines.pop()  # "" after a final newline; else a line a kill may have cut short
        try:
            if last.strip():
                json.loads(last)
                lines.append(last)  # complete, only its newline is missing: checked like the others
            torn = False
        except (json.JSONDecodeError, RecursionError):
            torn = True  # cut short by a kill: that evaluation runs again
        except ValueError:  # complete, with a number json cannot hold: refused below, naming its line
            lines.append(last)
            torn = False
        good: list[str] = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            rec = parse_record(line, f"{self.records_path}: line {n}", arg_names=self.arg_names)
            if rec.key not in self.records:
                self.records[rec.key] = rec
                self.order.append(rec.key)
                good.append(line)
        if torn or (text and not text.endswith("\n")) or len(good) != len(lines):
            # Rewrite without torn or repeated lines, so appends start on a clean line.
            write_text(self.records_path, "".join(g + "\n" for g in good))

    def _create(self) -> IO[str]:
        """The state's files, at the first evaluation (see the module docstring)."""
        output_dir(self.dir)
        write_text(self.config_path, json.dumps(self._stored, indent=1) + "\n")
        write_text(self.records_path, "")
        return open_append(self.records_path)

    def get(self, key: str) -> EvaluationRecord | None:
        """The stored record of a point, if any."""
        return self.records.get(key)

    def add(self, record: EvaluationRecord) -> None:
        """Persist one evaluation (append, flush, fsync)."""
        key = record.key
        if key in self.records:
            return
        if self._fh is None:
            self._fh = self._create()
        self._fh.write(json.dumps(record.to_json(), separators=(",", ":"), allow_nan=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records[key] = record
        self.order.append(key)

    def close(self) -> None:
        """Close the records file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __len__(self) -> int:
        return len(self.records)


__all__ = ["CONFIG_NAME", "RECORDS_NAME", "RECORD_KEYS", "SweepStore", "parse_record"]
