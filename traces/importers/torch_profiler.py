"""Import a ``torch.profiler`` Chrome trace (``export_chrome_trace``) as a per-layer trace.

Layers are ranges on a CPU thread, found one of two ways (``group``):

* ``record_function``: ``user_annotation`` events, i.e. ``torch.profiler.record_function(name)``
  ranges; :func:`record_layers` opens one around each pipeline layer of our GPT. By default the
  innermost named ranges are layers, except ``ProfilerStep#N``, ranges torch opens itself
  (``Optimizer.*``, ``enumerate(DataLoader)#*``) and ranges holding autograd backward work (a user's
  ``record_function("backward")``); with ``pattern`` the ranges whose name matches (outermost
  where matches nest, so no time is counted twice).
* ``module``: ``python_function`` events named ``nn.Module: <Class>_<k>``. torch 2.13 writes them
  only with ``profile(with_stack=True)``; ``with_modules=True`` alone writes none. By default the
  direct children of the outermost module (for our GPT: ``Embedding_0``, ``Block_0`` …,
  ``LayerNorm_4``, ``LMHead_0``); ``pattern`` (globs, :class:`NamePattern`) matches the ``<Class>_<k>`` names. ``<k>`` counts
  per class object, so two classes with the same ``__name__`` (our ``Embedding`` and
  ``nn.Embedding``) both yield ``Embedding_0``; ranges with one name merge into one layer.
* ``auto``: ``record_function`` if the trace has such ranges besides torch's own, else ``module``.

Forward time is the layers' range time divided by the profiled steps (``ProfilerStep#N`` ranges,
else the occurrences of the first layer; ``steps`` overrides). Where every layer ran more often
than there are ``ProfilerStep#N`` ranges (gradient accumulation: several micro-batches per step)
it is divided by the runs of the least-run layer instead, since a trace's times are per
micro-batch. A trace that spans several processes (ranks merged into one file, each under its own
``pid``) is counted per process: a layer's time is its mean over the processes that hold it, and
a backward op is matched only with forward ops of its own process (each rank numbers its autograd
nodes from the same start). With GPU kernels in the trace it is the time of the kernels launched
inside the ranges (:class:`~.chrome_events.KernelLaunches`).

Backward time: each top-level ``autograd::engine::evaluate_function: XxxBackward0`` event (GPU
kernels in it, with kernels) is charged to the layer whose range holds the forward op with the
same ``args["Sequence number"]`` on the forward thread. In torch 2.13 the backward side's
``args["Fwd thread id"]`` is torch's internal thread number (1, 2 …), not the OS tid, and forward
ops carry ``Fwd thread id`` 0; so internal ids are mapped to OS threads by majority over the
sequence numbers they share. Backward ops whose twin is in no range (the loss) go to the ranged
forward op with the nearest lower sequence number (nearest higher if none: the next step's first
layer is often nearer than the loss's own last layer) — but not those whose twin lies in a range
``pattern`` left out: what the pattern leaves out stays out and is reported unattributed (with
``Block_*`` the LM head's backward used to land on the last block, +74 % on a gpt-mini trace). ``AccumulateGrad`` has no sequence number;
the engine runs it right after the node that produced the gradient, so it goes to that node's
layer. The rest is reported in the notes as unattributed. A profiler cannot split the backward
into input and weight gradients: ``backward_split="combined"``.

Code compiled with ``torch.compile`` (:mod:`.compiled`): a compiled graph inside one layer's range
is that layer's, its ``CompiledFunctionBackward`` too (a model compiled per block imports with one
record per block; ``torch.compile(block)``'s ``OptimizedModule_<k>`` is named after the block it
wraps). Where the layers cannot be told apart inside compiled code (a model compiled as a whole)
the import is refused with what to do instead.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as _dt
import fnmatch
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mindpipe.traces.config import Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.chrome_events import (
    MODULE_PREFIX,
    KernelLaunches,
    Ranges,
    Span,
    Thread,
    int_arg,
    leaves,
    load_events,
    outermost,
    read_spans,
)
from mindpipe.traces.importers.compiled import CompiledCode, is_compile_annotation, unwrap_compiled_modules
from mindpipe.traces.trace import LayerRecord, Provenance, Trace

GROUPS = ("auto", "record_function", "module")
MAX_PATTERN_CHARS = 1000
_STEP_RE = re.compile(r"ProfilerStep#\d+$")
_TORCH_OWN_RE = re.compile(r"ProfilerStep#\d+$|Optimizer\.|enumerate\(DataLoader\)#")
_EVALUATE = "autograd::engine::evaluate_function"
_HINTS = {
    "record_function": "wrap each layer in torch.profiler.record_function(name) (record_layers(net) does it for "
    "our GPT), or pass --pattern GLOB to pick ranges by name",
    "module": "torch writes 'nn.Module: ...' events only with torch.profiler.profile(with_stack=True); "
    "--pattern GLOB picks module names such as 'Block_*'",
}


@contextlib.contextmanager
def record_layers(net: Any) -> Iterator[None]:
    """Open a ``torch.profiler.record_function(name)`` range around each layer's forward.

    The hooks are ``torch.compiler.disable``'d, so under ``torch.compile`` they run outside the
    compiled code: dynamo ignores a ``record_function`` traced into a graph (it logs "Profiler record
    function ... will be ignored"), which would leave a compiled layer without its range. A model
    compiled per block (``block.compile()`` or ``torch.compile(block)``, as torchtitan does) keeps
    its graphs, each inside its block's range (``fullgraph=True`` included). A model compiled as a
    whole is broken into one graph per layer at the hooks (cross-layer fusions are lost: the trace
    times that program), and with ``fullgraph=True`` dynamo refuses ("Skip calling
    `torch.compiler.disable()`d function"). The first use imports ``torch._dynamo`` (a few
    seconds); a hook call costs about a microsecond more.

    Args:
        net: A model with ``layers()`` yielding ``(name, kind, module)``, e.g. our ``GPT``.

    Example:
        >>> with record_layers(net), torch.profiler.profile() as prof:  # doctest: +SKIP
        ...     lm_loss(net(tokens), targets).backward()
    """
    import torch  # here, not at import time: the importer itself does not need torch

    handles = []
    for name, _kind, module in net.layers():
        stack: list[Any] = []

        def pre(_mod: Any, _args: Any, name: str = name, stack: list[Any] = stack) -> None:
            # Keep the record_function itself: what __enter__ returns is not it under dynamo (None).
            rf = torch.profiler.record_function(name)
            rf.__enter__()
            stack.append(rf)

        def post(_mod: Any, _args: Any, _out: Any, stack: list[Any] = stack) -> None:
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(torch.compiler.disable(pre)))
        handles.append(module.register_forward_hook(torch.compiler.disable(post), always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclass(frozen=True)
class NamePattern:
    """``--pattern``: shell-style globs (``*``, ``?``, ``[...]``), alternatives separated by ``|``.

    A name matches when it matches one glob as a whole (``fnmatch.fnmatchcase``). Globs replace the
    regular expressions of earlier versions: Python's ``re`` backtracks exponentially on patterns
    such as ``^(a+)+$``, while ``fnmatch`` translates ``*`` without nested quantifiers, so a match
    costs at most about len(name) × len(pattern) steps.
    """

    pattern: str

    @classmethod
    def parse(cls, text: str, source: str) -> NamePattern:
        """Check the pattern's length and alternatives (errors name ``source``)."""
        if not text or len(text) > MAX_PATTERN_CHARS:
            raise ContractError(source, "pattern", f"pattern must be 1 to {MAX_PATTERN_CHARS} characters, got "
                                                   f"{len(text)}")
        if any(not alt for alt in text.split("|")):
            raise ContractError(source, "pattern", f"pattern {text!r} has an empty alternative (between '|')")
        return cls(text)

    def matches(self, name: str) -> bool:
        """True when ``name`` matches one of the alternatives."""
        return any(fnmatch.fnmatchcase(name, alt) for alt in self.pattern.split("|"))


def _select(spans: list[Span], group: str, names: NamePattern | None, source: str,
            compiled: CompiledCode) -> tuple[list[Span], str, list[Span]]:
    """The layer ranges, a description of how they were chosen, and the ranges of that group the
    pattern left out (none without a pattern). ``compiled`` explains a compiled trace without ranges."""
    notes = [s for s in spans if s.cat == "user_annotation" and s.name and not _STEP_RE.match(s.name)
             and not is_compile_annotation(s.name)]
    if group == "auto":
        group = "record_function" if any(not _TORCH_OWN_RE.match(s.name) for s in notes) else "module"
    left_out: list[Span] = []
    if group == "record_function" and names is not None:
        chosen, how = outermost(s for s in notes if names.matches(s.name)), "record_function ranges matching the pattern"
        left_out = [s for s in notes if not names.matches(s.name)]
    elif group == "record_function":
        chosen = leaves(s for s in notes if not _TORCH_OWN_RE.match(s.name))
        index = Ranges(chosen)  # leaves are disjoint per thread
        backward = {
            r.index for b in spans if b.name.startswith(_EVALUATE) if (r := index.find(b.thread, b.start, b.end))
        }
        chosen, how = [s for s in chosen if s.index not in backward], "innermost record_function ranges"
    else:
        modules = [replace(s, name=s.name[len(MODULE_PREFIX) :]) for s in spans if s.cat == "python_function"]
        modules = unwrap_compiled_modules([m for m in modules if m.name])
        if names is not None:
            chosen, how = outermost(m for m in modules if names.matches(m.name)), "nn.Module ranges matching the pattern"
            left_out = [m for m in modules if not names.matches(m.name)]
        else:
            roots = {s.index for s in outermost(modules)}
            chosen = outermost(m for m in modules if m.index not in roots) or [m for m in modules if m.index in roots]
            how = "nn.Module ranges of the top module's children"
    if not chosen:
        which = f"{group} grouping" + (f" with pattern {names.pattern!r}" if names is not None else "")
        hint = compiled.no_layers_hint() if compiled else _HINTS[group]
        raise ContractError(source, "traceEvents", f"no layer ranges found with {which}: {hint}")
    return chosen, how + (f" {names.pattern!r}" if names is not None else ""), left_out


def _attribute_backward(
    spans: list[Span], ranges: list[Span], cost: Callable[[Span], int], source: str,
    left_out: Sequence[Span] = (),
) -> tuple[dict[str, int], Counter[str]]:
    """Backward ns per layer, and ns per attribution rule (see the module docstring). ``left_out``:
    the ranges ``--pattern`` did not choose; a backward op whose twin lies in one of them (and in no
    chosen range) is left unattributed, not charged to the nearest chosen layer.

    Sequence numbers and internal thread ids are per process (each rank numbers its autograd
    nodes from the same start), so a backward op is matched only with forward ops of its own
    process (``pid``).
    """
    index, left = Ranges(ranges), Ranges(list(left_out))
    twin: dict[tuple[Thread, int], str] = {}
    outside: set[tuple[Thread, int]] = set()  # forward ops only in ranges the pattern left out
    seq_threads: dict[tuple[Any, int], list[Thread]] = defaultdict(list)
    ranged: dict[Thread, list[tuple[int, str]]] = defaultdict(list)
    evaluate: list[Span] = []
    for s in spans:
        if s.cat != "cpu_op":
            continue
        seq, fwd_tid = int_arg(s, "Sequence number", source), int_arg(s, "Fwd thread id", source)
        if s.name.startswith(_EVALUATE):
            evaluate.append(s)
        elif seq is not None and seq >= 0 and not fwd_tid:  # backward-side ops carry the forward thread's id
            if s.thread not in seq_threads[(s.thread[0], seq)]:
                seq_threads[(s.thread[0], seq)].append(s.thread)
            r = index.find(s.thread, s.start, s.end)
            if r is not None and (s.thread, seq) not in twin:
                twin[(s.thread, seq)] = r.name
                ranged[s.thread].append((seq, r.name))
            elif r is None and left.find(s.thread, s.start, s.end) is not None:
                outside.add((s.thread, seq))
    for items in ranged.values():
        items.sort()
    top = sorted(outermost(evaluate), key=lambda s: (s.start, s.index))
    votes: dict[tuple[Any, int | None], Counter[Thread]] = defaultdict(Counter)
    for b in top:
        seq = int_arg(b, "Sequence number", source)
        for t in seq_threads.get((b.thread[0], seq), []) if seq is not None else []:
            votes[(b.thread[0], int_arg(b, "Fwd thread id", source))][t] += 1
    thread_of = {key: min(c, key=lambda t: (-c[t], str(t))) for key, c in votes.items()}
    ranged_by_pid: dict[Any, list[Thread]] = defaultdict(list)
    for t in ranged:
        ranged_by_pid[t[0]].append(t)
    only = {pid: ts[0] for pid, ts in ranged_by_pid.items() if len(ts) == 1}
    per_layer: dict[str, int] = defaultdict(int)
    rules: Counter[str] = Counter()
    previous: dict[Thread, str | None] = {}
    for b in top:
        pid = b.thread[0]
        seq = int_arg(b, "Sequence number", source)
        seq = seq if seq is not None and seq >= 0 else None
        cands = seq_threads.get((pid, seq), []) if seq is not None else []
        thread: Thread | None = (
            cands[0] if len(cands) == 1 else thread_of.get((pid, int_arg(b, "Fwd thread id", source)), only.get(pid))
        )
        layer: str | None = None
        rule = "unattributed"
        if seq is None:
            layer, rule = previous.get(b.thread), "by the backward node that ran just before (AccumulateGrad)"
        elif thread is not None and (layer := twin.get((thread, seq))) is not None:
            rule = "by its forward op's sequence number"
        elif thread is not None and (thread, seq) in outside:
            rule = "unattributed (its forward op is in a range the pattern leaves out)"
        elif thread is not None and ranged.get(thread):
            layer, rule = _nearest(ranged[thread], seq), "by the nearest ranged forward op's sequence number"
        previous[b.thread] = layer
        rules[rule if layer is not None or rule.startswith("unattributed") else "unattributed"] += cost(b)
        if layer is not None:
            per_layer[layer] += cost(b)
    return per_layer, rules


def _nearest(items: list[tuple[int, str]], seq: int) -> str:
    """Layer of the largest sequence number <= ``seq``, else of the smallest above it."""
    i = bisect.bisect_right(items, (seq, "\U0010ffff"))
    return items[i - 1][1] if i > 0 else items[0][1]


def _forward_ns(ranges: list[Span], cost: Callable[[Span], int]) -> tuple[dict[str, int], dict[str, set[Any]]]:
    """Per layer name, in order of first occurrence, its summed forward cost (ns) and the processes holding it."""
    forward: dict[str, int] = {}
    pids: dict[str, set[Any]] = defaultdict(set)
    for r in sorted(ranges, key=lambda s: (s.start, s.index)):
        forward[r.name] = forward.get(r.name, 0) + cost(r)
        pids[r.name].add(r.thread[0])
    return forward, pids


@dataclass(frozen=True)
class _Steps:
    """Profiled steps of each process (``pid``) that holds layer ranges, and where the counts came from.

    A trace merged from several ranks holds each rank's steps; a layer's summed time is divided by
    the steps of the processes holding it, so a layer every data-parallel rank runs gets its mean
    over the ranks (not their sum), and a pipeline rank's layer its own rank's steps.
    """

    by_pid: dict[Any, int]
    source: str
    unit: str = "steps"

    def of(self, pids: set[Any]) -> int:
        """Steps summed over ``pids``: what a layer held by those processes is divided by."""
        return sum(self.by_pid[p] for p in pids)

    @property
    def total(self) -> int:
        """Steps summed over every process (the divisor of whole-trace totals)."""
        return sum(self.by_pid.values())

    def describe(self) -> str:
        """``3 steps (ProfilerStep#N ranges)``, with the processes when there are several."""
        counts = sorted(set(self.by_pid.values()))
        text = f"{'/'.join(map(str, counts))} {self.unit} ({self.source})"
        if len(self.by_pid) > 1:
            text += (f" on each of {len(self.by_pid)} processes (pids {', '.join(map(str, self.by_pid))}; a layer's "
                     "time is its mean over the processes that hold it)")
        return text


def _notes(how: str, num_ranges: int, kernels: KernelLaunches | None, steps: _Steps, rules: dict[str, int],
           compiled: str = "") -> str:
    """The trace's provenance notes: how the layers were found, what was timed, what the backward charged,
    and where compiled code ran (``compiled``, if any)."""
    timing = (
        f"GPU kernel time ({kernels.count} kernels, {kernels.unlinked} not linked to a launch)"
        if kernels is not None
        else "CPU wall time"
    )
    charged = "; ".join(f"{ns / steps.total / 1e9:.6g} s {rule}" for rule, ns in sorted(rules.items()))
    return (
        f"torch.profiler Chrome trace; layers: {how} ({num_ranges} ranges); times: {timing} divided by "
        f"{steps.describe()}; backward per {'micro-batch' if steps.unit == 'micro-batches' else 'step'}: "
        f"{charged or 'none found'}; backward_split=combined "
        "(the profiler cannot separate input and weight gradients)" + (f"; {compiled}" if compiled else "")
    )


def _step_count(spans: list[Span], ranges: list[Span], steps: int | None) -> _Steps:
    """The profiled micro-batches of each process holding layer ranges: ``steps`` if given, else
    its ``ProfilerStep#N`` ranges, or the runs of its least-run layer where every layer ran more
    often than that (several micro-batches per step), else the runs of its first layer."""
    ordered = sorted(ranges, key=lambda s: (s.start, s.index))
    pids = list(dict.fromkeys(r.thread[0] for r in ordered))
    if steps:
        return _Steps(dict.fromkeys(pids, steps), "given")
    named: dict[Any, set[str]] = defaultdict(set)
    for s in spans:
        if s.cat in ("user_annotation", "cpu_op") and _STEP_RE.match(s.name):
            named[s.thread[0]].add(s.name)
    everywhere = set().union(*named.values()) if len(pids) == 1 else set()  # one process: wherever torch put them
    by_pid: dict[Any, int] = {}
    sources: list[str] = []
    for p in pids:
        runs_of = Counter(r.name for r in ordered if r.thread[0] == p)
        first = next(r.name for r in ordered if r.thread[0] == p)
        step_names = named.get(p) or everywhere
        if step_names and (fewest := min(runs_of.values())) > len(step_names):
            # Gradient accumulation: prof.step() per optimizer step, every layer once per
            # micro-batch inside it. A trace's times are per micro-batch (the Trace contract); the
            # layer that ran fewest times counts them (a name two modules share runs more often).
            by_pid[p] = fewest
            sources.append(f"{len(step_names)} ProfilerStep#N ranges, {fewest / len(step_names):g} micro-batches per "
                           "step: the runs of every layer")
        elif step_names:
            by_pid[p] = len(step_names)
            sources.append("ProfilerStep#N ranges")
        else:
            by_pid[p] = runs_of[first]
            sources.append("occurrences of the first layer")
    unit = "micro-batches" if any("micro-batches per step" in s for s in sources) else "steps"
    return _Steps(by_pid, " / ".join(dict.fromkeys(sources)), unit)


_BLOCK_NAME = re.compile(r"(block|layer)$", re.IGNORECASE)
"""A range whose name, less its index, ends so is a transformer block (``Block``, ``GPT2Block``,
``LlamaDecoderLayer``, ``TransformerLayer``)."""


def standard_kinds(kinds: list[str]) -> dict[str, str]:
    """The simulator's layer kinds (``embedding``, ``block``, ``final_norm``, ``lm_head``) for the
    kinds of a model's layers in order, where they are named otherwise (``--group module`` names
    them by class: ``Embedding``, ``LlamaDecoderLayer``, ``LlamaRMSNorm``, ``Linear``); ``{}`` when
    the blocks are already ``block`` or cannot be told.

    The blocks are the one kind ending in ``Block`` or ``Layer`` (any case); before the first of
    them, a kind naming an embedding is the embedding; after the last, a norm is the final norm and
    then a head or a linear layer is the LM head. Anything else keeps its kind.
    """
    if "block" in kinds:
        return {}
    blocks = {k for k in kinds if _BLOCK_NAME.search(k)}
    if len(blocks) != 1:
        return {}
    (block,) = blocks
    first, last = kinds.index(block), len(kinds) - 1 - kinds[::-1].index(block)
    out = {block: "block"}
    for k in dict.fromkeys(kinds[:first]):
        if "embed" in k.lower():
            out.setdefault(k, "embedding")
    after = list(dict.fromkeys(kinds[last + 1:]))
    norm = next((k for k in after if k.lower().endswith("norm")), None)
    if norm is not None:
        out[norm] = "final_norm"
    head = next((k for k in after[after.index(norm) + 1 if norm is not None else 0:]
                 if re.search(r"head|linear", k, re.IGNORECASE)), None)
    if head is not None:
        out[head] = "lm_head"
    return out


def _layer_records(forward: dict[str, int], backward: dict[str, int], divisor: dict[str, int]) -> list[LayerRecord]:
    """One record per layer, its summed nanoseconds divided by its ``divisor`` (steps or micro-batches), in
    seconds; its kind is its name less its index, as the simulator names it (:func:`standard_kinds`)."""
    kinds = {name: re.sub(r"[._]?\d+$", "", name) or name for name in forward}
    standard = standard_kinds(list(kinds.values()))
    return [
        LayerRecord(
            name=name,
            kind=standard.get(kinds[name], kinds[name]),
            forward_s=ns / divisor[name] / 1e9,
            backward_input_s=backward.get(name, 0) / divisor[name] / 1e9,
            backward_weight_s=0.0,
        )
        for name, ns in forward.items()
    ]


def import_torch_profiler(
    path: str | os.PathLike[str],
    *,
    group: str = "auto",
    pattern: str | None = None,
    steps: int | None = None,
    device: str | None = None,
    dtype: str = "unknown",
    model: Model | None = None,
    micro_batch_size: int | None = None,
    seq_len: int | None = None,
    command: str = "",
) -> Trace:
    """Read a ``torch.profiler`` Chrome trace (``.json`` or ``.json.gz``) into a per-layer Trace.

    Args:
        path: The trace file, as written by ``profile.export_chrome_trace``.
        group: ``record_function``, ``module`` or ``auto`` (see the module docstring).
        pattern: Globs selecting the layer ranges by name (:class:`NamePattern`: ``Block_*``,
            ``attn*|mlp*``), matched against the whole name.
        steps: Number to divide the summed times by (default: ``ProfilerStep#N`` ranges, or the
            runs of the least-run layer where every layer ran several times per step, else the
            number of times the first layer occurs; see the module docstring).
        device: Device label; default ``cuda`` if the trace has GPU kernels, else ``cpu``.
        dtype: Activation dtype, if known.
        model: The profiled model, if known.
        micro_batch_size: Micro-batch size the trace was taken at, if known.
        seq_len: Sequence length the trace was taken at, if known.
        command: Command line for the provenance.

    Raises:
        ContractError: naming the file for a missing or malformed file, a non-Chrome trace, a
            malformed event (by index and field), a bad pattern or no layer ranges found.
    """
    source = str(path)
    if group not in GROUPS:
        raise ContractError(source, "group", f"group={group!r} is not one of {', '.join(GROUPS)}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
        raise ContractError(source, "steps", f"steps={steps!r} must be a positive integer")
    names = NamePattern.parse(pattern, source) if pattern is not None else None
    events = load_events(path)
    spans = read_spans(events, source)
    compiled = CompiledCode.find(spans)
    ranges, how, left_out = _select(spans, group, names, source, compiled)
    compiled_note = compiled.check(ranges, left_out, names is not None, source)
    kernels = KernelLaunches(spans, events, source) if any(s.cat == "kernel" for s in spans) else None
    cost: Callable[[Span], int] = kernels.gpu_ns if kernels is not None else (lambda s: s.dur)
    forward, holders = _forward_ns(ranges, cost)
    profiled = _step_count(spans, ranges, steps)
    backward, rules = _attribute_backward(spans, ranges, cost, source, left_out)
    notes = _notes(how, len(ranges), kernels, profiled, rules, compiled_note)
    try:  # a record's own rules (a time past the record_seconds limit) name the file too
        records = _layer_records(forward, backward, {name: profiled.of(pids) for name, pids in holders.items()})
        return Trace(
            device=device or ("cuda" if kernels is not None else "cpu"),
            dtype=dtype,
            layers=records,
            provenance=Provenance(
                tool="mindpipe import torch-profiler",
                command=command,
                date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                source_file=source,
                notes=notes,
            ),
            model=model,
            model_name=model.label if model is not None else None,
            micro_batch_size=micro_batch_size,
            seq_len=seq_len,
            granularity="layer",
            backward_split="combined",
        )
    except ContractError as e:
        raise ContractError(source, e.key, e.rule) from None
