"""``torch.compile`` in a ``torch.profiler`` Chrome trace: where compiled code ran, and whether its
time can be told apart by layer.

What a profile of compiled code holds (torch 2.13, CPU, Inductor and ``aot_eager`` alike; the
events the tests' synthetic traces copy):

* Each call of a compiled frame is a ``cpu_op`` ``Torch-Compiled Region: <frame>/<compile>`` (after
  a ``TorchDynamo Cache Lookup``). Inside it, a graph compiled for training is one
  ``CompiledFunction`` op (AOTAutograd's autograd function, with a ``Sequence number``) around
  ``## Call CompiledFxGraph <hash> ##`` and the graph's kernels. Its backward is one autograd node,
  ``autograd::engine::evaluate_function: CompiledFunctionBackward``, with the same sequence number.
* Dynamo ignores ``torch.profiler.record_function`` traced into a graph (it logs "Profiler record
  function ... will be ignored"), and ``profile(with_stack=True)`` records no ``nn.Module: ...``
  call inside compiled code. Inductor's kernel names (``cpp_fused_add_embedding_native_layer_norm_0``
  with ``cpp.enable_kernel_profile``) name the fused aten ops, not modules, and one kernel spans
  two modules there (the embedding's add and the first block's LayerNorm). So the time inside a
  compiled graph belongs to whatever range holds the whole graph, and to nothing finer.
* ``torch.compile(module)`` wraps the module in an ``OptimizedModule``: with ``with_stack=True`` its
  call is ``nn.Module: OptimizedModule_<k>`` around the wrapped module's ``nn.Module: Block_<k>``.
* Compiling during a profiled step shows as ops named ``... (dynamo_timed)`` and annotations
  ``...: compile_id=3/5``.

Hence the rules (:meth:`CompiledCode.check`): a compiled graph may lie inside one layer's range
(a model compiled per block: the block's time and its ``CompiledFunctionBackward`` are the
block's) or outside every range where an uncompiled op could (a compiled loss after the last
layer); the import is refused where the layers cannot be told apart: the only layer found holds a
compiled region (a model compiled as a whole), a layer range lies inside one ``CompiledFunction``
(ranges kept in the graph by ``torch._dynamo.config.capture_profiler_record_function``: the
backward is still one node), compiled code ran between two layers of one forward pass outside
every range (their ranges were dropped), or compilation ran inside a layer's range.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from mindpipe.traces.errors import ContractError
from mindpipe.traces.importers.chrome_events import Ranges, Span, Thread, outermost

REGION_PREFIX = "Torch-Compiled Region"
GRAPH = "CompiledFunction"
COMPILING_SUFFIX = " (dynamo_timed)"
_EVALUATE = "autograd::engine::evaluate_function"
_WRAPPER = re.compile(r"OptimizedModule_\d+$")
_NAME_CHARS = 80

ADVICE = (
    "profile it uncompiled, or compile each block on its own (block.compile() or torch.compile(block) per block, as "
    "torchtitan does) and profile with with_stack=True or inside record_layers(net)"
)


def is_compile_annotation(name: str) -> bool:
    """True for the ``user_annotation`` ranges torch.compile opens itself, never layers: dynamo's
    while it compiles (``dynamo_data: compile_id=3/5``) and Inductor's around a graph's call with
    ``torch._inductor.config.profiler_mark_wrapper_call`` (``graph_0_inductor_wrapper_call``)."""
    return "compile_id=" in name or name.endswith("inductor_wrapper_call")


def _short(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 1] + "…"


def unwrap_compiled_modules(modules: Sequence[Span]) -> list[Span]:
    """``modules`` (``nn.Module`` ranges, prefix stripped) with each ``OptimizedModule_<k>`` range,
    ``torch.compile(module)``'s wrapper, named after the one module it wraps (``Block_0``), so that a
    model compiled per block as torchtitan does it imports as blocks. The range keeps the wrapper's
    extent (dynamo's guard checks are part of the block's time); a wrapper around several modules or
    none keeps its name."""
    by_thread: dict[Thread, list[Span]] = defaultdict(list)
    for m in modules:
        if not _WRAPPER.match(m.name):
            by_thread[m.thread].append(m)
    starts: dict[Thread, list[int]] = {}
    for t, ms in by_thread.items():
        ms.sort(key=lambda s: (s.start, -s.end, s.index))
        starts[t] = [m.start for m in ms]
    out: list[Span] = []
    for m in modules:
        if _WRAPPER.match(m.name) and m.thread in by_thread:
            ms, ss = by_thread[m.thread], starts[m.thread]
            inner = outermost(s for s in ms[bisect.bisect_left(ss, m.start) : bisect.bisect_right(ss, m.end)]
                              if s.end <= m.end)
            if len({s.name for s in inner}) == 1:
                m = replace(m, name=inner[0].name)
        out.append(m)
    return out


@dataclass(frozen=True)
class CompiledCode:
    """The compiled code a trace ran: dynamo's regions, AOTAutograd's graphs and compilation, each
    the outermost of its kind per thread."""

    regions: tuple[Span, ...]
    graphs: tuple[Span, ...]
    compiling: tuple[Span, ...]

    @classmethod
    def find(cls, spans: Sequence[Span]) -> CompiledCode:
        """The compiled regions, graphs and compile steps among ``spans``. Regions and graphs that
        run inside the backward (a checkpointed block's recompute) are the backward's, not a forward's."""
        backward = Ranges(s for s in spans if s.cat == "cpu_op" and s.name.startswith(_EVALUATE))
        ops = [s for s in spans if s.cat == "cpu_op" and backward.find(s.thread, s.start, s.end) is None]
        return cls(
            regions=tuple(outermost(s for s in ops if s.name.startswith(REGION_PREFIX))),
            graphs=tuple(outermost(s for s in ops if s.name == GRAPH)),
            compiling=tuple(outermost(s for s in spans if s.cat in ("cpu_op", "user_annotation")
                                      and s.name.endswith(COMPILING_SUFFIX))),
        )

    def __bool__(self) -> bool:
        return bool(self.regions or self.graphs)

    def no_layers_hint(self) -> str:
        """Why a compiled trace has no layer ranges, and what to do (for the "no layer ranges" error)."""
        first = (self.regions or self.graphs)[0]
        return (f"the trace ran torch.compile'd code ('{_short(first.name)}', traceEvents[{first.index}]), inside which "
                f"dynamo drops record_function ranges and with_stack=True records no nn.Module calls: {ADVICE}")

    def check(self, chosen: Sequence[Span], left_out: Sequence[Span], patterned: bool, source: str) -> str:
        """Refuse a trace whose compiled code cannot be charged to the layers ``chosen`` (see the
        module docstring); else return a note for the provenance ("" without compiled code).

        Args:
            chosen: The layer ranges.
            left_out: The ranges of the same grouping that ``--pattern`` left out: compiled code in
                them is what the user left out, not a dropped layer.
            patterned: Whether the layers were chosen by ``--pattern`` (then one layer may be meant).
            source: The file, for errors.

        Raises:
            ContractError: naming the event (``traceEvents[i]``) and what to do instead.
        """
        layers = Ranges(chosen)
        for c in self.compiling:
            if (r := layers.find(c.thread, c.start, c.end)) is not None:
                raise _error(source, c, f"torch.compile compiled ('{_short(c.name)}') inside layer '{_short(r.name)}' "
                             "during a profiled step, so its time is compile time: profile after warm-up steps that run "
                             "every compiled graph once (torch.profiler.schedule(warmup=...)), with no recompilation")
        graphs = Ranges(self.graphs)
        for r in chosen:
            if (g := graphs.find(r.thread, r.start, r.end)) is not None:
                raise _error(source, r, f"layer '{_short(r.name)}' lies inside one torch.compile graph ('{GRAPH}', "
                             f"traceEvents[{g.index}]) whose backward is one autograd node (CompiledFunctionBackward) "
                             f"that cannot be split among its layers: {ADVICE}")
        if not self:
            return ""
        if not patterned and len({r.name for r in chosen}) == 1:
            inside = [s for s in (*self.regions, *self.graphs) if layers.find(s.thread, s.start, s.end)]
            if inside:
                raise _error(source, inside[0], (
                    f"the only layer found, '{_short(chosen[0].name)}', holds torch.compile'd code "
                    f"('{_short(inside[0].name)}'): a model compiled as a whole runs as graphs the profiler cannot split "
                    f"into layers (Inductor fuses across them): {ADVICE}"))
        self._check_between(chosen, Ranges([*chosen, *left_out]), source)
        held = sum(1 for s in self.regions if layers.find(s.thread, s.start, s.end))
        return (f"torch.compile: {held} of {len(self.regions)} compiled regions inside layer ranges (a layer's backward "
                "includes its graphs' CompiledFunctionBackward)")

    def _check_between(self, chosen: Sequence[Span], ranged: Ranges, source: str) -> None:
        """Refuse compiled code that ran between two layers of one forward pass (the later layer
        first ran after the earlier one) in no range: the layers inside it lost their ranges."""
        order: dict[str, int] = {}
        for r in sorted(chosen, key=lambda s: (s.start, s.index)):
            order.setdefault(r.name, len(order))
        by_thread: dict[Thread, list[Span]] = defaultdict(list)
        for r in chosen:
            by_thread[r.thread].append(r)
        starts: dict[Thread, list[int]] = {}
        for t, rs in by_thread.items():
            rs.sort(key=lambda s: (s.start, s.index))
            starts[t] = [r.start for r in rs]
        for reg in self.regions:
            rs = by_thread.get(reg.thread, [])
            if ranged.find(reg.thread, reg.start, reg.end) is not None or not rs:
                continue
            i = bisect.bisect_left(starts[reg.thread], reg.start)
            if i < len(rs) and rs[i].end <= reg.end:
                continue  # holds layer ranges (a whole-model compile split at record_layers' hooks)
            before, after = (rs[i - 1] if i > 0 else None), (rs[i] if i < len(rs) else None)
            if before is not None and after is not None and order[after.name] > order[before.name]:
                raise _error(source, reg, (
                    f"torch.compile'd code ('{_short(reg.name)}') ran between layers '{_short(before.name)}' and "
                    f"'{_short(after.name)}' in no layer range: dynamo drops record_function ranges inside compiled "
                    "code, so the layers in it cannot be told: open the ranges outside it (record_layers(net) does), "
                    "profile with with_stack=True, or put a range around that code"))


def _error(source: str, span: Span, rule: str) -> ContractError:
    where = f"traceEvents[{span.index}]"
    return ContractError(source, where, f"{where}: {rule}")


__all__ = ["ADVICE", "CompiledCode", "is_compile_annotation", "unwrap_compiled_modules"]
