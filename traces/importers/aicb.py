"""Import AICB workload files (Alibaba AICB / SimAI, ASTRA-sim 1.0 text workload format).

Format (``aliyun/aicb: workload/simAI/model_workload/``; BACKGROUND.md §11): line 1 holds the
parallelism policy (``HYBRID_TRANSFORMER_FWD_IN_BCKWD``) and ``model_parallel_NPU_group: <tp>``;
line 2 an entry count (not always equal to the rows present, so rows are read to the end); then
one row per layer with 12 whitespace-separated fields::

    name  -1  fwd_ns  fwd_comm  fwd_bytes  ig_ns  ig_comm  ig_bytes  wg_ns  wg_comm  wg_bytes  update_ns

Times are nanoseconds (simulator ticks) and are kept exactly (``seconds = ns / 1e9``); AICB writes
``1`` as a placeholder for operations it did not time, and those stay 1 ns. AICB already splits
the backward into input-gradient (ig) and weight-gradient (wg) parts, so the trace's
``backward_split`` is ``measured``. Rows are AICB's units (e.g. ``attention_layer`` and
``mlp_layer`` are the two halves of a Megatron block), not MindPipe's pipeline layers.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mindpipe.traces.config import Model
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.reading import AICB as AICB_FILE
from mindpipe.traces.reading import parse_int, read_text
from mindpipe.traces.trace import CommRecord, LayerRecord, Provenance, Trace

COLUMNS = (
    "name", "reserved", "forward_ns", "forward_comm", "forward_bytes", "input_grad_ns", "input_grad_comm",
    "input_grad_bytes", "weight_grad_ns", "weight_grad_comm", "weight_grad_bytes", "update_ns",
)
COMM_TYPES = {
    "NONE": None, "ALLREDUCE": "allreduce", "ALLGATHER": "allgather", "REDUCESCATTER": "reducescatter",
    "ALLTOALL": "alltoall", "BROADCAST": "broadcast",
}
_PHASES = (("forward", 3), ("backward_input", 6), ("backward_weight", 9))
_TP_RE = re.compile(r"model_parallel_NPU_group:\s*(\d{1,9})(?!\d)")


MAX_FIELD = 10**15  # ns (11.6 days) or bytes (1 PB): past any layer of any workload


def _int_field(fields: list[str], idx: int, source: str, lineno: int) -> int:
    return parse_int(fields[idx], source, f"line {lineno}: {COLUMNS[idx]}", 0, MAX_FIELD)


def _parse_row(fields: list[str], source: str, lineno: int) -> LayerRecord:
    if len(fields) != len(COLUMNS):
        raise ContractError(
            source, f"line {lineno}", f"line {lineno}: expected {len(COLUMNS)} whitespace-separated fields, got {len(fields)}"
        )
    comm: list[CommRecord] = []
    times: dict[str, float] = {}
    for phase, idx in _PHASES:
        times[phase] = _int_field(fields, idx - 1, source, lineno) / 1e9
        ctype = fields[idx].upper()
        if ctype not in COMM_TYPES:
            raise ContractError(
                source, f"line {lineno}",
                f"line {lineno}: {COLUMNS[idx]}={fields[idx]!r} is not one of {', '.join(COMM_TYPES)}",
            )
        size = _int_field(fields, idx + 1, source, lineno)
        op = COMM_TYPES[ctype]
        if op is not None:
            comm.append(CommRecord(phase=phase, op=op, size_bytes=size))
    name = fields[0]
    return LayerRecord(
        name=name,
        kind=re.sub(r"\d+$", "", name) or name,
        forward_s=times["forward"],
        backward_input_s=times["backward_input"],
        backward_weight_s=times["backward_weight"],
        update_s=_int_field(fields, 11, source, lineno) / 1e9,
        comm=comm,
    )


@dataclass(frozen=True)
class _Header:
    """What the two header lines say.

    Attributes:
        tp: ``model_parallel_NPU_group`` of line 1: the tensor-parallel degree.
        declared: The entry count of line 2 (not always the number of rows present).
    """

    tp: int
    declared: int


def _read_header(lines: list[str], source: str) -> _Header:
    """Check lines 1 and 2 of the workload and read the tensor-parallel degree and entry count."""
    if not lines or "model_parallel_NPU_group" not in lines[0]:
        raise ContractError(source, "line 1", "line 1: not an AICB workload header (expected 'model_parallel_NPU_group: N')")
    tp_match = _TP_RE.search(lines[0])
    max_tp = int(limit("devices"))
    if tp_match is None or not 1 <= int(tp_match[1]) <= max_tp:
        raise ContractError(source, "line 1", f"line 1: model_parallel_NPU_group must be an integer in [1, {max_tp}]")
    if len(lines) < 2 or re.fullmatch(r"[0-9]{1,9}", lines[1].strip()) is None:
        raise ContractError(source, "line 2", "line 2: expected the number of entries")
    return _Header(tp=int(tp_match[1]), declared=int(lines[1].strip()))


def _read_rows(lines: list[str], source: str) -> list[LayerRecord]:
    """One record per non-blank row after the header, read to the end of the file."""
    rows = [(n, line) for n, line in enumerate(lines[2:], start=3) if line.strip()]
    if len(rows) > limit("aicb_rows"):
        raise ContractError(source, "layers", f"{len(rows)} layer rows; an AICB workload may have at most "
                                              f"{limit('aicb_rows'):,} (limit)")
    records = [_parse_row(line.split(), source, n) for n, line in rows]
    if not records:
        raise ContractError(source, "layers", "no layer rows after the header")
    return records


def import_aicb(
    path: str | os.PathLike[str],
    *,
    device: str | None = None,
    model: Model | None = None,
    micro_batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str = "unknown",
    command: str = "",
) -> Trace:
    """Read an AICB workload file into a :class:`~mindpipe.traces.trace.Trace`.

    Args:
        path: The workload file.
        device: Device label; default: guessed from the file name (``..._A100.txt`` → ``a100``).
        model: The model the workload describes, if known (AICB files do not say).
        micro_batch_size: Micro-batch size; default: ``mbsN`` in the file name, if present.
        seq_len: Sequence length, if known.
        dtype: Activation dtype, if known.
        command: Command line for the provenance.

    Raises:
        ContractError: naming the file and the line for a missing file, a bad header or a
            malformed row.
    """
    source = str(path)
    lines = read_text(path, AICB_FILE).splitlines()
    header = _read_header(lines, source)
    records = _read_rows(lines, source)
    stem = Path(path).stem
    if device is None:
        dev = re.search(r"_(A100|H100|H800|H20|H200|V100)\b", stem, re.IGNORECASE)
        device = dev[1].lower() if dev else "unknown"
    if micro_batch_size is None:
        mbs = re.search(r"mbs(\d{1,6})(?!\d)", stem)
        micro_batch_size = int(mbs[1]) if mbs and int(mbs[1]) > 0 else None
    try:
        return Trace(
            device=device,
            dtype=dtype,
            layers=records,
            flash_attention=True,  # AICB's AIOB op lists time FlashAttention (``atten_flash``)
            provenance=Provenance(
                tool="mindpipe import aicb",
                command=command,
                date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                source_file=source,
                notes=(
                    f"AICB workload {lines[0].split()[0]}; {header.declared} entries declared, {len(records)} rows read; "
                    "times are AICB's nanoseconds / 1e9 (1 ns = AICB placeholder)"
                ),
            ),
            model=model,
            model_name=stem.split("_")[1] if stem.count("_") >= 1 else stem,
            micro_batch_size=micro_batch_size,
            seq_len=seq_len,
            tp=header.tp,
            sequence_parallel="_sp_" in f"_{stem}_",
        )
    except ContractError as e:
        raise ContractError(source, e.key, e.rule) from None
