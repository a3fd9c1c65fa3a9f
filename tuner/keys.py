"""The plan keys the tuner searches, the what-if knobs among them, and ``--fix`` / ``--what-if`` parsing.

A *point* is a plain dict of plan keys (without ``partition``) plus ``partitioner`` — the name of
the rule that will write the partition (:mod:`mindpipe.tuner.partition`). :func:`plan_of` is the
one place a point becomes a :class:`~mindpipe.traces.config.Plan`.

What-if knobs (DESIGN.md "searched means runnable") are plan keys that only the simulator
models: the executor runs one value of each, :data:`mindpipe.traces.what_if.WHAT_IF_KEYS` (their
owner, on the Plan contract) names it, and the default
search space pins every knob there. ``comm_priority=pp_first`` (p2p traffic first on shared
links) needs stream priorities the executor does not set; ``overlap_grad_reduce=true`` needs
gradient buckets reduced during the last backward, while torch.distributed.pipelining reduces a
stage's gradients after it; ``tp_comm_overlap=true`` needs Transformer Engine's userbuffers and
``overlap_param_gather=true`` the distributed optimizer's all-gather from the next forward's
pre-hooks, which DTensor and FSDP2 do not have. ``mindpipe tune --what-if`` searches these four
(``SEARCHED_WHAT_IF_KEYS``); the fifth, ``blocking_p2p`` (Megatron's blocking pipeline
exchanges), ``--what-if blocking_p2p --fix blocking_p2p=true`` pins to plan for a Megatron-LM
deployment (``all`` leaves it out: it only costs time); the sixth, ``fused_elementwise`` (a Llama
block's norms, rotary embedding and SwiGLU as Transformer Engine's fused kernels), likewise
(it only saves time), and the seventh, ``dp_impl`` (``megatron``: Megatron-LM's DDP and distributed
optimizer instead of the executor's FSDP2), likewise (it plans for another framework). Every output marks a plan that uses one (:func:`what_if_used`).

Keys searched on request (``--search``, :data:`SEARCH_ON_REQUEST_KEYS`) are plan keys the executor
runs but the default space leaves at one value: ``cp`` (context parallelism) splits each mesh's
data-parallel devices into dp × cp, which multiplies the meshes, and each cp > 1 point needs
FlashAttention (the Plan's cp rule), so ``--search cp`` tries cp = 1 with it too. ``--fix cp=N``
pins it without ``--search``, like any plan key.

The parsers name each argument by its ``mindpipe tune`` flag unless the caller gives its own
naming (:class:`ArgNames`: :data:`PYTHON_ARG_NAMES` for :func:`mindpipe.tuner.api.tune`'s keywords).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mindpipe.traces.config import (
    COMM_PRIORITIES,
    CP_COMM_TYPES,
    DP_IMPLS,
    PLAN_SCALAR_KEYS,
    PRECISIONS,
    RANK_ORDERS,
    RECOMPUTE,
    SCHEDULES,
    SUBNET_SCHEDULES,
    SUPERNET_PLAN_KEYS,
    Plan,
    check_plan_key,
)
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import integer, limit, shown
from mindpipe.traces.reading import parse_json
from mindpipe.traces.what_if import SEARCHED_WHAT_IF_KEYS, WHAT_IF_KEYS, what_if_used

PARTITIONERS = ("balanced", "pipedream", "even", "vpipe", "dawnpiper", "given")

# What a Python caller of :func:`mindpipe.tuner.api.tune` wrote for each ``mindpipe tune`` flag: its
# keyword, or ``argument.field`` for a field of the SweepConfig (``config``) or Objective
# (``objective``) it passed (the job a time-shift places is one ``objective.shift``, the training
# target one ``objective.target``); ``--flash-attention`` and ``--dtype`` are the profiler's (how a
# trace was taken).
PYTHON_NAMES = {
    "--model": "model", "--cluster": "cluster", "--out": "out", "--trace": "trace", "--calibration": "calibration",
    "--objective": "objective", "--global-batch": "global_batch", "--fix": "fixes", "--partitioner": "partitioners",
    "--what-if": "what_if", "--search": "search", "--resume": "resume", "--subnets": "subnets", "--clocks": "clocks",
    "--max-slowdown": "max_slowdown", "--critical-batch": "objective.critical_batch",
    "--constraint": "objective.constraints", "--target-samples": "objective.target", "--carbon-csv": "objective.shift",
    "--window": "objective.shift", "--job-hours": "objective.shift", "--iterations": "objective.shift",
    "--interruptible": "objective.shift", "--target-batch": "objective.target", "--optimizer": "config.optimizer", "--surrogate": "config.surrogate",
    "--initial-points": "config.n_initial", "--budget": "config.budget", "--seed": "config.seed",
    "--workers": "config.workers", "--batch-size": "config.batch_size", "--dask": "config.dask",
    "--dask-timeout": "config.dask_timeout_s", "--flash-attention": "ProfileOptions.flash_attention",
    "--dtype": "ProfileOptions.dtype", "--microbatches": "num_microbatches",
}
# Flags whose Python argument is a list (the CLI repeats the flag, or takes a comma list).
_PYTHON_LISTS = ("--fix", "--partitioner")


@dataclass(frozen=True)
class ArgNames:
    """How the caller named the arguments an error message points at: ``mindpipe tune``'s flags or
    :func:`~mindpipe.tuner.api.tune`'s keywords.

    The validation is written once and names each argument by its flag (``"--fix"``); the caller
    picks the naming — :data:`CLI_ARG_NAMES` keeps the flags (the CLI's messages), and
    :data:`PYTHON_ARG_NAMES` says ``fixes``, ``what_if="cp"`` (:data:`PYTHON_NAMES`).

    Attributes:
        python: The caller is Python code (keywords and literals), not a command line.
    """

    python: bool = False

    def name(self, flag: str) -> str:
        """What the caller calls ``flag``'s argument (a flag without a Python name keeps it)."""
        return PYTHON_NAMES.get(flag, flag) if self.python else flag

    def given(self, flag: str, value: str | int | float, *, placeholder: bool = False) -> str:
        """How the caller passes ``value`` to ``flag``: ``--what-if comm_priority`` on the command line,
        ``what_if="comm_priority"`` (``fixes=["tp=8"]`` for a list argument, ``config.budget=0`` for a
        number) in Python; a ``placeholder`` (``B``) stands for a value, so Python writes it bare
        (``objective.critical_batch=B``)."""
        if not self.python or flag not in PYTHON_NAMES:
            return f"{flag} {value}"
        literal = str(value) if placeholder else json.dumps(value)
        return f"{self.name(flag)}=[{literal}]" if flag in _PYTHON_LISTS else f"{self.name(flag)}={literal}"

    def switched_on(self, flag: str) -> str:
        """How the caller turns the switch ``flag`` on: ``--resume``, or ``resume=True`` in Python."""
        return f"{self.name(flag)}=True" if self.python and flag in PYTHON_NAMES else flag

    def names(self, *flags: str) -> list[str]:
        """What the caller calls each of ``flags``, each name once (five time-shifting flags are one
        ``objective.shift`` in Python), in order."""
        return list(dict.fromkeys(self.name(f) for f in flags))

    def either(self, *items: str) -> str:
        """``items`` as alternatives, ``A, B or C``: flags named as the caller names them (each name
        once), other words as they are (``"the critical batch"``)."""
        said = list(dict.fromkeys(self.name(i) if i.startswith("--") else i for i in items))
        return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"

    @property
    def several(self) -> str:
        """How the caller gives several values of a list argument."""
        return "a list" if self.python else "a comma list"

    def error(self, error: ContractError) -> ContractError:
        """``error`` naming the caller's argument where its source is a flag; else ``error`` itself.

        For validation owned elsewhere that names its flag as the source (the search space, the
        objective): the source is renamed, the rule's words are its owner's.
        """
        name = self.name(error.source)
        if name == error.source:
            return error
        return type(error)(name, error.key, error.rule).with_traceback(error.__traceback__)

    @contextmanager
    def renaming(self) -> Iterator[None]:
        """Raise what the block raises, renamed by :meth:`error`."""
        try:
            yield
        except ContractError as e:
            renamed = self.error(e)
            if renamed is e:
                raise
            raise renamed from None


CLI_ARG_NAMES = ArgNames(python=False)
"""The flags of ``mindpipe tune`` (every parser's default)."""
PYTHON_ARG_NAMES = ArgNames(python=True)
"""The keywords of :func:`mindpipe.tuner.api.tune`."""


def check_partitioners(names: Iterable[str], given_allowed: bool = False, *,
                       arg_names: ArgNames = CLI_ARG_NAMES) -> tuple[str, ...]:
    """Raise unless ``names`` (``--partitioner``) holds at least one known partitioner and no other;
    the names, each once (``balanced,balanced`` is one value of the dimension, not two copies of
    every plan).

    ``given`` (the partition pinned with ``--fix partition=...``) is no name a user types: it is
    accepted only where ``given_allowed``. Errors name the argument as ``arg_names`` does.
    """
    names = list(names)
    typed = ", ".join(PARTITIONERS[:-1])
    source = arg_names.name("--partitioner")
    if not names:
        raise ContractError(source, None, f"name at least one of {typed}")
    for p in names:
        if p not in PARTITIONERS or (p == "given" and not given_allowed):
            raise ContractError(source, None, f"{p!r} is not one of {typed}")
    return tuple(dict.fromkeys(names))

# Keys a point (and --fix) may carry; order fixes the column order of the output tables.
POINT_KEYS = (
    "dp", "tp", "pp", "cp", "micro_batch_size", "global_batch_size", "schedule", "virtual_stages", "recompute",
    "sequence_parallel", "zero_stage", "comm_priority", "precision", "overlap_grad_reduce", "tp_comm_overlap",
    "overlap_param_gather", "flash_attention", "loss_chunks", "fused_head_loss", "blocking_p2p", "fused_elementwise",
    "dp_impl", "rank_order", "cp_comm_type", "partitioner",
)
# Keys a point may leave out, with the value that means (points written before the key existed,
# or by hand); a point's identity (point_key) names them only when they differ from it, so a sweep
# stored before the key existed resumes as the same points.
# A key a point leaves out takes the Plan's default (plan_of), so the value is the Plan contract's.
PLAN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Plan)
                                 if f.default is not dataclasses.MISSING}
OPTIONAL_POINT_KEYS: dict[str, Any] = {k: PLAN_DEFAULTS[k] for k in (
    "flash_attention", "loss_chunks", "fused_head_loss", "blocking_p2p", "fused_elementwise", "dp_impl", "cp",
    "cp_comm_type")}
# What-if knobs ``--what-if`` searches (or lets ``--fix KEY=VALUE`` pin) only when it names them, though
# ``all`` leaves them out: ``blocking_p2p=true`` only ever costs time, ``fused_elementwise=true`` only
# ever saves it and ``dp_impl=megatron`` is another framework's, so searching them is never wanted,
# but pinning them plans for a Megatron-LM deployment (blocking pipeline exchanges; Transformer
# Engine's fused norm, rotary and SwiGLU kernels; Megatron's DDP and distributed optimizer) instead
# of the executor's.
NAMED_WHAT_IF_KEYS = ("blocking_p2p", "fused_elementwise", "dp_impl")
# Plan keys the executor runs that the default space leaves at their OPTIONAL_POINT_KEYS value and
# ``--search`` opens: ``cp`` (context parallelism) multiplies the device meshes.
SEARCH_ON_REQUEST_KEYS = ("cp",)
# The fourth dimension (NASPipe): points of a supernet carry these too; GPT points never do, so their
# identity (point_key) is unchanged.
SUPERNET_POINT_KEYS = SUPERNET_PLAN_KEYS
LIST_KEYS = ("partition", "layer_memory_policy")  # pinned as JSON lists, copied into every plan
_INT_KEYS = ("dp", "tp", "pp", "cp", "micro_batch_size", "global_batch_size", "virtual_stages", "zero_stage", "subnet_window",
             "loss_chunks")
_BOOL_KEYS = ("sequence_parallel", "overlap_grad_reduce", "tp_comm_overlap", "overlap_param_gather", "flash_attention",
              "blocking_p2p", "fused_head_loss", "fused_elementwise")
_STR_CHOICES: dict[str, tuple[str, ...]] = {
    "schedule": SCHEDULES, "recompute": RECOMPUTE, "comm_priority": COMM_PRIORITIES, "precision": PRECISIONS,
    "rank_order": RANK_ORDERS, "partitioner": PARTITIONERS, "subnet_schedule": SUBNET_SCHEDULES,
    "cp_comm_type": CP_COMM_TYPES, "dp_impl": DP_IMPLS,
}

Point = dict[str, Any]
_INT_RE = re.compile(r"[+-]?[0-9]{1,18}")


def plan_of(point: Mapping[str, Any], pinned: Mapping[str, list[Any]] | None = None,
            partition: list[int] | None = None) -> Plan:
    """The :class:`Plan` of a point: its plan keys, the pinned list keys and ``partition`` copied in.

    Keys the point leaves out take the Plan's defaults (the search space checks partial points).

    Raises:
        ContractError: a value the Plan contract refuses (source empty; the caller names it).
    """
    kwargs: dict[str, Any] = {k: point[k] for k in (*POINT_KEYS, *SUPERNET_POINT_KEYS) if k != "partitioner" and k in point}
    for key, value in (pinned or {}).items():
        kwargs[key] = list(value)
    if partition is not None:
        kwargs["partition"] = list(partition)
    return Plan(**kwargs)


def parse_what_if(value: str | Iterable[str] | None, *, arg_names: ArgNames = CLI_ARG_NAMES) -> tuple[str, ...]:
    """``--what-if`` into the knobs to search: ``all`` (or an empty string) → every knob; ``KEY[,KEY]``.

    Raises:
        ContractError: a key that is not a what-if knob (naming the arguments as ``arg_names`` does).
    """
    if value is None:
        return ()
    items = [v.strip().replace("-", "_") for v in (value.split(",") if isinstance(value, str) else value)]
    items = [v for v in items if v]
    if not items or items == ["all"]:
        return tuple(SEARCHED_WHAT_IF_KEYS)
    known = (*SEARCHED_WHAT_IF_KEYS, *NAMED_WHAT_IF_KEYS)
    flag = arg_names.name("--what-if")
    for key in items:
        if key in SEARCH_ON_REQUEST_KEYS:
            raise ContractError(flag, key, f"{key} is not a what-if knob: mindpipe run carries it out; "
                                f"search it with {arg_names.given('--search', key)}")
        if key not in known:
            raise ContractError(flag, key, f"{key} is not a what-if knob (known: all, {', '.join(known)})")
    return tuple(k for k in known if k in items)


def parse_search(value: str | Iterable[str] | None, *, arg_names: ArgNames = CLI_ARG_NAMES) -> tuple[str, ...]:
    """``--search KEY[,KEY]`` into the plan keys to search beyond the default space (:data:`SEARCH_ON_REQUEST_KEYS`).

    Raises:
        ContractError: a key that is not one of them (naming the arguments as ``arg_names`` does).
    """
    if value is None:
        return ()
    items = [v.strip().replace("-", "_") for v in (value.split(",") if isinstance(value, str) else value)]
    items = [v for v in items if v]
    flag = arg_names.name("--search")
    if not items:
        raise ContractError(flag, None, f"{flag} needs a key (known: {', '.join(SEARCH_ON_REQUEST_KEYS)})")
    for key in items:
        if key not in SEARCH_ON_REQUEST_KEYS:
            what = f"{key} is searched by default" if key in POINT_KEYS else f"{shown(key)} is not a plan key"
            raise ContractError(flag, None, f"{what} ({flag} takes: {', '.join(SEARCH_ON_REQUEST_KEYS)})")
    return tuple(k for k in SEARCH_ON_REQUEST_KEYS if k in items)


def _parse_scalar(key: str, text: str, flag: str) -> Any:
    """One ``--fix`` value (``flag``: what the caller calls ``--fix``), checked by the plan key's own
    rule (:func:`~mindpipe.traces.config.check_plan_key`)."""
    text = text.strip()
    if key in _INT_KEYS:
        if not _INT_RE.fullmatch(text):
            raise ContractError(flag, key, f"{key}={shown(text)} must be an integer (at most 18 digits)")
        value: Any = int(text)
    elif key in _BOOL_KEYS:
        low = text.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise ContractError(flag, key, f"{key}={text!r} must be true or false")
        value = low in ("true", "1", "yes")
    else:
        allowed = _STR_CHOICES[key]
        if text not in allowed:
            raise ContractError(flag, key, f"{key}={text!r} is not one of {', '.join(allowed)}")
        value = text
    if key in PLAN_SCALAR_KEYS:
        try:
            check_plan_key(key, value)  # tp=0 would otherwise reach the search space's arithmetic
        except ContractError as e:
            raise ContractError(flag, e.key, e.rule) from None
    return value


def parse_fixes(items: Iterable[str], *, arg_names: ArgNames = CLI_ARG_NAMES) -> dict[str, Any]:
    """Parse ``--fix KEY=VALUE`` arguments.

    ``KEY=A,B`` restricts a key to a set of values (a list); ``partition`` and
    ``layer_memory_policy`` take a JSON list (``partition=[3,5]``); ``partition`` also pins the
    partitioner to ``given``.

    Raises:
        ContractError: unknown key, malformed value, or a key pinned twice (naming the arguments as
            ``arg_names`` does).
    """
    flag = arg_names.name("--fix")
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ContractError(flag, None, f"{item!r} is not KEY=VALUE")
        if key in out:
            raise ContractError(flag, key, f"{key} is pinned twice")
        if key == "partitioner":  # the space's partitioner dimension is --partitioner's alone
            raise ContractError(flag, key, f"the partitioner is chosen with {arg_names.given('--partitioner', 'NAME')} "
                                f"({arg_names.several} is searched as a dimension), not {flag}")
        if key in LIST_KEYS:
            out[key] = _parse_list(key, value, flag)
        elif key in POINT_KEYS or key in SUPERNET_POINT_KEYS:
            # A set of values: one named twice (tp=2,2; sequence_parallel=true,1) is one value, not
            # a second copy of every point of the space.
            values = list(dict.fromkeys(_parse_scalar(key, v, flag) for v in value.split(",")))
            out[key] = values[0] if len(values) == 1 else values
        else:
            known = ", ".join((*POINT_KEYS, *SUPERNET_POINT_KEYS, *LIST_KEYS))
            raise ContractError(flag, key, f"{key}: not a plan key (known: {known})")
    return out


def read_fixes(fixes: Mapping[str, Any] | Iterable[str] | str | None, *,
               arg_names: ArgNames = CLI_ARG_NAMES) -> dict[str, Any]:
    """Pinned plan keys from ``--fix KEY=VALUE`` strings (one string, a list) or a Python mapping
    (``{"tp": 8, "schedule": ["1f1b", "zb_h1"]}``), every value checked by :func:`parse_fixes`'s rules:
    a mapping is written as the strings it stands for, so both forms refuse the same values.

    Raises:
        ContractError: see :func:`parse_fixes`.
    """
    if fixes is None:
        return {}
    if isinstance(fixes, str):
        return parse_fixes([fixes], arg_names=arg_names)
    if isinstance(fixes, Mapping):
        return parse_fixes((f"{key}={_fix_text(str(key).strip().replace('-', '_'), value)}"
                            for key, value in fixes.items()), arg_names=arg_names)
    return parse_fixes(fixes, arg_names=arg_names)


def _fix_text(key: str, value: Any) -> str:
    """A mapping's value as ``--fix`` text: a JSON list for the list keys, else values joined by commas."""
    if key in LIST_KEYS:
        return json.dumps(value) if isinstance(value, list | tuple) else shown(value)
    values = list(value) if isinstance(value, list | tuple) else [value]

    def one(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v) if isinstance(v, int | str) else shown(v)  # 8.0 then fails an integer key's rule

    return ",".join(one(v) for v in values)


def check_fixes_what_if(fixes: Mapping[str, Any], what_if: Iterable[str], *,
                        arg_names: ArgNames = CLI_ARG_NAMES) -> None:
    """Refuse ``--fix`` of a what-if knob to a value the executor does not run, unless it is searched.

    Raises:
        ContractError: e.g. ``--fix: comm_priority=pp_first is a what-if knob ...`` (naming the
            arguments as ``arg_names`` does).
    """
    enabled = set(what_if)
    for key, run in WHAT_IF_KEYS.items():
        if key not in fixes or key in enabled:
            continue
        values = fixes[key] if isinstance(fixes[key], list) else [fixes[key]]
        other = [v for v in values if v != run]
        if other:
            raise ContractError(arg_names.name("--fix"), key, (
                f"{key}={json.dumps(other[0])} is a what-if knob (the executor runs only {key}={json.dumps(run)}): "
                f"add {arg_names.given('--what-if', key)} to search or pin it"))


def _parse_list(key: str, value: str, flag: str) -> list[Any]:
    """``partition=[3,5]`` (positive integers) or ``layer_memory_policy=["keep",...]`` (names);
    ``flag``: what the caller calls ``--fix``."""
    example = f"{key}=[4,4]" if key == "partition" else f'{key}=["keep","recompute"]'
    try:
        parsed = parse_json(value, flag)
    except ContractError as e:
        raise ContractError(flag, key, f"{key} must be a JSON list, e.g. {example} ({e.rule})") from None
    if not isinstance(parsed, list) or not 1 <= len(parsed) <= limit("num_layers"):
        raise ContractError(flag, key, f"{key} must be a JSON list of 1 to {limit('num_layers'):,} entries, "
                                       f"e.g. {example}")
    for i, item in enumerate(parsed):
        if key == "partition":
            try:
                integer(f"{key}[{i}]", item, 1, "num_layers")
            except ContractError as e:
                raise ContractError(flag, e.key, e.rule) from None
        elif not isinstance(item, str):
            raise ContractError(flag, f"{key}[{i}]", f"{key}[{i}]={shown(item)} must be a string")
    return parsed


def parse_global_batch(text: str, *, arg_names: ArgNames = CLI_ARG_NAMES) -> list[int]:
    """``N``, ``A,B,C`` or ``A:B`` (A, 2A, 4A … up to B) into a sorted list of global batch sizes.

    Every size must be in 1 .. the ``global_batch_size`` limit, and at most ``global_batch_choices``
    sizes (:data:`mindpipe.traces.limits.LIMITS`), so the list is small whatever the text.

    Raises:
        ContractError: ``--global-batch: '1:2^4000' is not N, A,B,C or A:B ...`` and the limits
            (naming the argument as ``arg_names`` does).
    """
    top, most = int(limit("global_batch_size")), int(limit("global_batch_choices"))
    flag = arg_names.name("--global-batch")
    usage = f"{shown(text)} is not N, A,B,C or A:B with 0 < A <= B <= {top:,} (the global_batch_size limit)"
    parts = text.split(":") if ":" in text else text.split(",")
    if len(parts) > most or (":" in text and len(parts) != 2):
        raise ContractError(flag, None, usage if ":" in text else
                            f"{len(parts)} global batch sizes; at most {most} (limit)")
    if not all(_INT_RE.fullmatch(p.strip()) and 0 < int(p) <= top for p in parts):
        raise ContractError(flag, None, usage)
    values = [int(p) for p in parts]
    if ":" in text:
        lo, hi = values
        if hi < lo:
            raise ContractError(flag, None, usage)
        out, g = [], lo
        while g <= hi:  # at most log2(top) + 1 = 25 sizes
            out.append(g)
            g *= 2
        return out
    return sorted(set(values))


def point_key(point: Mapping[str, Any]) -> str:
    """Canonical, stable identity of a point (used by the sweep store); a supernet point's subnet keys follow."""
    keys = (*(k for k in POINT_KEYS if k not in OPTIONAL_POINT_KEYS), *(k for k in SUPERNET_POINT_KEYS if k in point))
    values = [point[k] for k in keys]
    extra = {k: point[k] for k, default in OPTIONAL_POINT_KEYS.items() if point.get(k, default) != default}
    return json.dumps([*values, extra] if extra else values, separators=(",", ":"))


__all__ = [
    "CLI_ARG_NAMES",
    "LIST_KEYS",
    "NAMED_WHAT_IF_KEYS",
    "OPTIONAL_POINT_KEYS",
    "PARTITIONERS",
    "PLAN_DEFAULTS",
    "POINT_KEYS",
    "PYTHON_ARG_NAMES",
    "PYTHON_NAMES",
    "SEARCHED_WHAT_IF_KEYS",
    "SEARCH_ON_REQUEST_KEYS",
    "SUPERNET_POINT_KEYS",
    "WHAT_IF_KEYS",
    "ArgNames",
    "Point",
    "check_fixes_what_if",
    "parse_fixes",
    "parse_global_batch",
    "parse_search",
    "parse_what_if",
    "plan_of",
    "point_key",
    "read_fixes",
    "what_if_used",
]
