"""What makes a checkpoint directory one we may load: its record, its manifest, who can write it.

A torch.distributed.checkpoint (DCP) checkpoint is code: DCP's reader unpickles the step's
``.metadata`` file, and unpickling runs whatever the file says (torch's own documentation:
only load checkpoints you trust). MindPipe therefore loads only checkpoints that *you* wrote and
nobody else could have changed since (the trust model, stated in the README):

* every file and directory involved — ``DIR``, ``DIR/latest.json``, ``DIR/step-N`` and every file
  in it — belongs to the user running MindPipe and is not writable by group or others; links,
  sub-directories and other kinds of file inside a step are refused;
* ``DIR/step-N/manifest.json``, written by rank 0 after every rank finished saving, lists every file
  of the step with its size and sha256; a step without one, with a file it does not list, or with a
  file whose bytes differ is refused;
* each step's manifest names the model the step was written for and its TP degree (``written_for``),
  so a directory that two runs wrote into resumes each step only into the run it fits;
  ``latest.json`` names the newest step and every complete one (a manifest without
  ``written_for``, from before it existed, is read with the record's model and TP degree).

All of this is checked before torch reads any byte of the checkpoint, by the launcher (before any
rank starts) and again by every rank (:func:`mindpipe.executor.checkpoint.load`). The manifest
catches corruption and tampering by whoever cannot also rewrite it; the ownership and mode checks
are what keep others from rewriting it. This module does not import torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindpipe.traces.atomic import output_dir, write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.schema import read_json

LATEST = "latest.json"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CheckpointRecord:
    """``latest.json``: the newest complete step, every complete one, and what they were written for."""

    step: int
    tp: int
    complete: tuple[int, ...]
    model: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The JSON document."""
        return {"step": self.step, "tp": self.tp, "complete": list(self.complete), "model": self.model}


def step_dir(directory: str | os.PathLike[str], step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(directory) / f"step-{step}"


def _check_owner(path: Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise ContractError(str(path), None, f"{what} belongs to another user (uid {st.st_uid}); a checkpoint is "
                            "code (torch unpickles it): only resume from checkpoints you wrote")
    if st.st_mode & 0o022:
        raise ContractError(str(path), None, f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                            f"a checkpoint is code (torch unpickles it): chmod go-w {path} if you trust it")


def check_private_dir(path: str | os.PathLike[str], what: str = "checkpoint directory") -> None:
    """Refuse a directory that another user owns or that group/others may write.

    Raises:
        ContractError: not a directory, another owner, or group/world-writable.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise ContractError(str(p), None, f"cannot read the {what} ({e.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ContractError(str(p), None, f"the {what} is not a directory")
    _check_owner(p, st, f"the {what}")


def _trusted_file(path: Path, what: str, missing: ContractError) -> None:
    """Raise ``missing`` if ``path`` does not exist; refuse it unless a regular file of ours (no link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise missing from None
    if not stat.S_ISREG(st.st_mode):
        raise ContractError(str(path), None, "not a regular file")
    _check_owner(path, st, what)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _record_file(directory: str | os.PathLike[str]) -> Path | None:
    """``DIR/latest.json`` after the directory's and the file's trust checks (None: there is none).

    Raises:
        ContractError: an untrusted directory or file.
    """
    check_private_dir(directory)
    p = Path(directory) / LATEST
    if not os.path.lexists(p):
        return None
    _trusted_file(p, LATEST, ContractError(str(p), None, "missing"))
    return p


def _parse_record(p: Path) -> CheckpointRecord:
    data = read_json(p)
    ok = isinstance(data, dict) and set(data) == {"step", "tp", "complete", "model"} and _int(data["step"]) \
        and _int(data["tp"]) and isinstance(data["complete"], list) and all(_int(s) for s in data["complete"]) \
        and isinstance(data["model"], dict)
    if not ok:
        raise ContractError(str(p), None, "not a checkpoint record of this mindpipe (needs step, tp, complete, model); "
                            "checkpoints written before manifests cannot be resumed")
    return CheckpointRecord(data["step"], data["tp"], tuple(data["complete"]), data["model"])


def read_record(directory: str | os.PathLike[str]) -> CheckpointRecord:
    """``latest.json`` of ``directory``, after the directory's and the file's trust checks.

    Raises:
        ContractError: no record, an untrusted directory or file, or a record not of this format.
    """
    p = _record_file(directory)
    if p is None:
        raise ContractError(str(directory), None, f"no checkpoint to resume from ({LATEST} missing)")
    return _parse_record(p)


def repair_record(directory: str | os.PathLike[str]) -> list[str]:
    """Before a resume (the launcher, before any rank starts): a ``latest.json`` that is missing or
    unreadable while step manifests say what they were written for is rebuilt from them, and a note
    says so; each step is still verified before it is loaded. An untrusted record is not replaced.

    Raises:
        ContractError: the directory or the record may not be trusted.
    """
    p = _record_file(directory)
    if p is None:
        why = "missing"
    else:
        try:
            _parse_record(p)
            return []
        except ContractError as e:
            why = f"unreadable ({e.rule})"
    steps = _manifest_steps(directory)
    if not steps:
        return []  # nothing to rebuild from: check_resume refuses with the record's own message
    origin = _written_for(directory, steps[-1])
    if origin is None:  # its manifest went since it was listed
        return []
    model, tp = origin
    write_record(directory, CheckpointRecord(steps[-1], tp, tuple(steps), model))
    return [f"{Path(directory) / LATEST} was {why}: rebuilt from the manifests of steps {steps}"]


def write_record(directory: str | os.PathLike[str], record: CheckpointRecord) -> None:
    """Write ``latest.json`` (safely; rank 0, after the step's manifest)."""
    write_text(Path(directory) / LATEST, json.dumps(record.to_json()) + "\n")


def _hash_open(path: Path) -> tuple[int, str, os.stat_result]:
    """(size, sha256, stat) of a file opened without following links (checked on the open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
    except OSError as e:
        raise ContractError(str(path), None, f"cannot read this checkpoint file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ContractError(str(path), None, "not a regular file: refused in a checkpoint")
        h = hashlib.sha256()
        size = 0
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest(), st


def _entries(step_path: Path) -> list[str]:
    names = []
    for e in os.scandir(step_path):
        if e.name == MANIFEST:
            continue
        if not e.is_file(follow_symlinks=False):
            raise ContractError(str(step_path / e.name), None, "not a regular file: refused in a checkpoint")
        names.append(e.name)
    return sorted(names)


def write_manifest(step_path: str | os.PathLike[str], model: dict[str, Any], tp: int) -> None:
    """Take group/other write permission off the step's files and record their sizes and sha256,
    and the model and TP degree the step was written for (rank 0)."""
    p = Path(step_path)
    os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o022)
    files = {}
    for name in _entries(p):
        os.chmod(p / name, stat.S_IMODE(os.lstat(p / name).st_mode) & ~0o022)
        size, digest, _ = _hash_open(p / name)
        files[name] = {"bytes": size, "sha256": digest}
    doc = {"format": MANIFEST_FORMAT, "written_for": {"model": model, "tp": tp}, "files": files}
    write_text(p / MANIFEST, json.dumps(doc, indent=1) + "\n")


def remove_manifest(step_path: str | os.PathLike[str]) -> None:
    """Drop a step's manifest before the step is written again (an interrupted save then has none)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(step_path) / MANIFEST)


def _origin(doc: dict[str, Any]) -> tuple[dict[str, Any], int] | None:
    """A manifest's ``written_for`` as (model, tp); None when it has none (written before it existed)."""
    w = doc.get("written_for")
    if w is None:
        return None
    if not (isinstance(w, dict) and isinstance(w.get("model"), dict) and _int(w.get("tp"))):
        raise ContractError(MANIFEST, "written_for", "not a model document and a TP degree")
    return w["model"], w["tp"]


def verify_step(step_path: str | os.PathLike[str]) -> tuple[dict[str, Any], int] | None:
    """Check a step's files against its manifest and the trust rules, without reading them as a checkpoint.

    Returns the model and TP degree the step was written for (None: its manifest predates them).

    Raises:
        ContractError: one line naming the file and what is wrong.
    """
    p = Path(step_path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise ContractError(str(p), None, "checkpoint step directory is missing") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ContractError(str(p), None, "not a directory: refused as a checkpoint step")
    _check_owner(p, st, "the step directory")
    mp = p / MANIFEST
    _trusted_file(mp, MANIFEST, ContractError(str(p), None, f"no {MANIFEST}: the checkpoint cannot be verified, refused"))
    doc = read_json(mp)
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT else None
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and _int(v.get("bytes")) and isinstance(v.get("sha256"), str) for v in files.values()):
        raise ContractError(str(mp), None, f"not a checkpoint manifest of format {MANIFEST_FORMAT}")
    present = _entries(p)
    extra, missing = sorted(set(present) - set(files)), sorted(set(files) - set(present))
    if extra or missing:
        what = (f"{', '.join(extra)} not in the manifest" if extra else "") + \
               ("; " if extra and missing else "") + (f"{', '.join(missing)} missing" if missing else "")
        raise ContractError(str(p), None, f"files do not match {MANIFEST}: {what}")
    for name in present:
        size, digest, fst = _hash_open(p / name)
        _check_owner(p / name, fst, "the file")
        if size != files[name]["bytes"] or digest != files[name]["sha256"]:
            raise ContractError(str(p / name), None, f"does not match {MANIFEST} (sha256 {digest[:12]}…, "
                                f"expected {files[name]['sha256'][:12]}…): corrupted or changed since it was written")
    try:
        return _origin(doc)
    except ContractError as e:
        raise ContractError(str(mp), e.key, e.rule) from None


def _shown(value: Any) -> str:
    """A model key's value in a message: JSON, at most 40 characters."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:39] + "…"


def _same_model(recorded: Any, model: dict[str, Any]) -> bool:
    """Whether the checkpoint's model document describes ``model``, keys left out meaning their defaults.

    Checkpoints written before a model key existed (``num_kv_heads``, ``rope_theta``,
    ``tie_embeddings``) lack it; both sides are read through the Model contract, so a missing key
    equals its default. A document the contract refuses is compared as it is.
    """
    from mindpipe.traces.config import Model  # local: the trust checks stay importable without the contracts
    from mindpipe.traces.schema import from_dict

    try:
        return from_dict(Model, recorded, "latest.json") == from_dict(Model, model, "model")
    except (ContractError, TypeError):
        return bool(recorded == model)


def check_resume(directory: str | os.PathLike[str], model: dict[str, Any], tp: int, step: int | None = None) -> int:
    """Everything a resume needs before torch reads the checkpoint; returns the step to load.

    Args:
        directory: The checkpoint directory.
        model: The model being trained, as a JSON document (must equal the checkpoint's).
        tp: The run's TP degree (the fused QKV layout depends on it).
        step: A chosen complete step, or None for the newest.

    Raises:
        ContractError: any trust, manifest or compatibility check fails (one line).
    """
    record = read_record(directory)
    chosen = record.step if step is None else step
    if chosen not in record.complete:
        raise ContractError(str(directory), "step", f"no complete checkpoint of step {chosen} "
                            f"(complete: {list(record.complete)})")
    if chosen == record.step:  # the record names the newest step's model and TP degree: refused before hashing
        _check_written_for(record.model, record.tp, model, tp, str(directory))
    origin = verify_step(step_dir(directory, chosen))
    if origin is not None:
        _check_written_for(*origin, model, tp, str(step_dir(directory, chosen)))
    elif chosen != record.step:  # a manifest from before written_for: the record's, as it always was
        _check_written_for(record.model, record.tp, model, tp, str(directory))
    return chosen


def _check_written_for(written_model: dict[str, Any], written_tp: int, model: dict[str, Any], tp: int,
                       where: str) -> None:
    """Refuse a checkpoint written for another model or TP degree (one line naming what differs)."""
    if not _same_model(written_model, model):
        name = written_model.get("name") or written_model.get("kind")
        keys = sorted(k for k in set(written_model) | set(model)
                      if written_model.get(k) != model.get(k) and k != "name")
        diff = ", ".join(f"{k} {_shown(written_model.get(k))} (this run: {_shown(model.get(k))})" for k in keys[:4])
        more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
        raise ContractError(where, "model", f"the checkpoint was written for another model, {name}"
                            + (f": {diff}{more}" if diff else "")
                            + f"; this run trains {model.get('name') or model.get('kind')}")
    if written_tp != tp:
        raise ContractError(where, "tp", f"checkpoint was written with tp={written_tp}, this plan has tp={tp}")


def complete_steps(directory: str | os.PathLike[str]) -> list[int]:
    """The directory's complete steps: the record's, or, when it is missing or unreadable, every
    ``step-N`` whose manifest names what it was written for (each is verified when resumed)."""
    try:
        return list(read_record(directory).complete)
    except ContractError:
        return _manifest_steps(directory)


def _manifest_steps(directory: str | os.PathLike[str]) -> list[int]:
    """Every ``step-N`` whose manifest names what it was written for (unverified), ascending."""
    steps = (int(p.name[5:]) for p in Path(directory).glob("step-*") if p.name[5:].isdigit())
    return sorted(s for s in steps if _written_for(directory, s) is not None)


def _written_for(directory: str | os.PathLike[str], step: int) -> tuple[dict[str, Any], int] | None:
    """What a step's manifest says it was written for, unverified (None: no readable manifest, or
    one from before ``written_for``); only to keep a record, never to trust a step."""
    try:
        doc = read_json(step_dir(directory, step) / MANIFEST)
        return _origin(doc) if isinstance(doc, dict) else None
    except (ContractError, OSError):
        return None


def fresh_run_notes(directory: str | os.PathLike[str]) -> list[str]:
    """Make the checkpoint directory of a run that does not resume (refusing one it cannot create
    or may not trust) and say what it already holds: that run writes its steps beside them,
    replacing those it reaches.

    Raises:
        ContractError: the directory cannot be created, or is another user's or writable by others.
    """
    prepare_save_dir(directory)
    held = complete_steps(directory)
    if not held:
        return []
    return [f"{directory} already holds complete checkpoint steps {held}: this run does not resume "
            f"(--resume continues from step {max(held)}), so it writes its own steps beside them and "
            "replaces those it reaches"]


def begin_save(directory: str | os.PathLike[str], step: int) -> None:
    """Before any rank writes ``step`` (rank 0): the directory made ready, and the step, if it was
    complete, taken out of the record first and its manifest removed, so an interrupted save leaves
    a record naming only steps that are whole (``--resume`` then takes the newest of those)."""
    prepare_save_dir(directory)
    try:
        record: CheckpointRecord | None = read_record(directory)
    except ContractError:
        record = None
    if record is not None and step in record.complete:
        rest = tuple(s for s in record.complete if s != step)
        if not rest:
            os.unlink(Path(directory) / LATEST)
        elif record.step == step:
            newest = max(rest)
            model, tp = _written_for(directory, newest) or (record.model, record.tp)
            write_record(directory, CheckpointRecord(newest, tp, rest, model))
        else:
            write_record(directory, CheckpointRecord(record.step, record.tp, rest, record.model))
    remove_manifest(step_dir(directory, step))


def finish_save(directory: str | os.PathLike[str], step: int, model: dict[str, Any], tp: int, keep: int = 0) -> None:
    """After every rank wrote ``step`` (rank 0): its manifest, then the record naming it newest.

    ``keep`` > 0 keeps only that many complete steps, ``step`` and the highest others
    (torchtitan's ``keep_latest_k``): the rest leave the record first, then the disk, so an
    interruption between the two leaves only unrecorded directories, never a recorded step that is gone.
    """
    write_manifest(step_dir(directory, step), model, tp)
    done = sorted(set(complete_steps(directory)) | {step})
    others = [s for s in done if s != step]
    kept = done if keep <= 0 else sorted([step, *(others[-(keep - 1):] if keep > 1 else [])])
    write_record(directory, CheckpointRecord(step, tp, tuple(kept), model))
    for old in sorted(set(done) - set(kept)):
        remove_manifest(step_dir(directory, old))  # unverifiable at once, should the removal stop half-way
        shutil.rmtree(step_dir(directory, old), ignore_errors=True)


def check_checkpoint_options(checkpoint_dir: str | None, **given: object) -> None:
    """Refuse a checkpoint option given without ``--checkpoint-dir`` (``resume=True``,
    ``keep_checkpoints=2``, ...; a false or zero value is not given), naming its flag.

    Raises:
        ContractError: the first such option.
    """
    for key, value in given.items():
        if value and not checkpoint_dir:
            raise ContractError("", key, f"--{key.replace('_', '-')} needs --checkpoint-dir")


def prepare_save_dir(directory: str | os.PathLike[str]) -> None:
    """Create the checkpoint directory (only its owner may write it), or refuse an existing one others may write.

    Raises:
        ContractError: the directory is another user's or writable by group/others, or not a directory.
    """
    p = Path(directory)
    if not os.path.lexists(p):
        output_dir(p)
        os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o022)
    check_private_dir(p)


__all__ = ["LATEST", "MANIFEST", "CheckpointRecord", "begin_save", "check_checkpoint_options", "check_private_dir", "check_resume", "complete_steps",
           "finish_save", "fresh_run_notes", "prepare_save_dir", "read_record", "remove_manifest", "repair_record", "step_dir", "verify_step",
           "write_manifest", "write_record"]
