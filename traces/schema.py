"""Strict JSON <-> dataclass conversion shared by every data contract.

The contracts (model, cluster, plan, trace, result) are plain dataclasses whose ``__post_init__``
checks value rules. This module adds what JSON needs on top: unknown keys, missing keys and wrong
types are rejected with a :class:`~mindpipe.traces.errors.ContractError` that names the source file and the
(dotted) key, and nested dataclasses and lists of them are converted recursively.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``X | None``, ``list[X]``,
``dict[str, X]``, ``typing.Any`` and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from mindpipe.traces import reading
from mindpipe.traces.atomic import write_bytes, write_text
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import shown
from mindpipe.traces.reading import TRACE, InputKind

T = TypeVar("T")

_HINTS: dict[type, dict[str, Any]] = {}
MAX_INT = 2**53
"""Largest integer magnitude a contract's integer field takes (a JSON reader keeps at most 2^53 exactly)."""


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return {"int": "an integer", "float": "a number", "bool": "true/false", "str": "a string"}.get(
            tp.__name__, f"an object ({tp.__name__})"
        )
    return str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Convert a JSON value to ``tp``; raise ContractError (source filled in later) on mismatch."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(value, non_none[0], key)
        raise ContractError("", key, f"unsupported union type {tp}")
    if origin is list:
        if not isinstance(value, list):
            raise ContractError("", key, f"must be a list, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError("", key, f"must be an object, got {type(value).__name__}")
        _, val_tp = typing.get_args(tp)
        return {str(k): _convert(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _from_mapping(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ContractError("", key, f"must be true or false, got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
                return int(value)
            raise ContractError("", key, f"must be an integer, got {shown(value)}")
        if abs(value) > MAX_INT:
            raise ContractError("", key, f"{shown(value)} is outside ±2^53, the integers JSON carries exactly")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ContractError("", key, f"must be a number, got {shown(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ContractError("", key, f"must be a finite number, got {shown(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ContractError("", key, f"must be a string, got {shown(value)}")
        return value
    raise ContractError("", key, f"unsupported field type {_type_name(tp)}")


def _from_mapping(cls: type[T], data: Any, prefix: str) -> T:
    if not isinstance(data, dict):
        what = prefix or "document"
        raise ContractError("", prefix or None, f"{what} must be a JSON object, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    dotted = (prefix + ".") if prefix else ""
    for k in data:
        if k not in fields:
            known = ", ".join(sorted(fields))
            name = f"{dotted}{k}" if len(str(k)) <= 60 else f"{dotted}{str(k)[:40]}..."
            raise ContractError("", name, f"{name}: unknown key (known keys: {known})")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], f"{dotted}{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ContractError("", f"{dotted}{name}", f"{dotted}{name}: missing required key")
    try:
        return cls(**kwargs)
    except ContractError as e:
        key = f"{dotted}{e.key}" if e.key and prefix else e.key
        rule = e.rule if not prefix or not e.key or not e.rule.startswith(e.key) else f"{dotted}{e.rule}"
        raise ContractError("", key, rule) from None


def from_dict(cls: type[T], data: Any, source: str = "<dict>") -> T:
    """Build a contract dataclass from parsed JSON, naming ``source`` in every error.

    Args:
        cls: The dataclass type to build.
        data: Parsed JSON (must be an object).
        source: File name or label used in error messages.

    Raises:
        ContractError: on unknown/missing keys, wrong types or broken value rules.
    """
    try:
        return _from_mapping(cls, data, "")
    except ContractError as e:
        raise ContractError(source, e.key, e.rule) from None


def to_dict(obj: Any) -> Any:
    """Convert a contract dataclass (recursively) to JSON-ready Python values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            out[f.name] = to_dict(getattr(obj, f.name))
        return out
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def read_json(path: str | os.PathLike[str], kind: InputKind = TRACE) -> Any:
    """Read a JSON file (gzip-compressed or not) through the reading layer (:mod:`mindpipe.traces.reading`).

    The path must be a regular file within ``kind``'s size limit; numbers must be finite and
    integers at most 18 digits; every problem is a one-line ContractError naming the file.
    """
    return reading.read_json(path, kind)


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` (a contract or plain data) as indented JSON (gzip-compressed if the name ends
    in ``.gz``, as :func:`read_json` reads it), through :func:`mindpipe.traces.atomic.open_output`:
    atomic for a regular file, in place for a device or FIFO, refused for a directory; missing
    parent directories are created."""
    text = json.dumps(to_dict(obj), indent=1) + "\n"
    if Path(path).suffix == ".gz":
        write_bytes(path, gzip.compress(text.encode("utf-8"), mtime=0), make_parents=True)
    else:
        write_text(path, text, make_parents=True)


def check_format_version(version: int, supported: int, kind: str) -> None:
    """Reject documents written by a newer (or unknown) format version."""
    if version != supported:
        raise ContractError("", "format_version", f"format_version={version} is not supported for {kind} (this MindPipe reads {supported})")
