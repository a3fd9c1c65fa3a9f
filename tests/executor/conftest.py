"""Helpers for the executor tests: a tiny model, and ``mindpipe run`` as a user runs it.

Multi-rank runs use CPU + gloo on loopback with one thread per rank. Process launches are the
expensive part (each rank imports torch.distributed), so tests share runs through module-scoped
fixtures and assert several things about each.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# 4 blocks so pp=2 with 2 virtual stages per rank has a block per stage; vocab 64 keeps the
# LM head small. TINY_TEXT has the 256-symbol vocabulary byte-level text needs.
TINY: dict[str, Any] = {"kind": "gpt", "num_layers": 4, "hidden_size": 32, "num_heads": 4, "seq_len": 16,
                        "vocab_size": 64, "name": "tiny4"}
TINY_TEXT: dict[str, Any] = {**TINY, "vocab_size": 256, "name": "tiny4-bytes"}
STEPS = 8  # parity, resume, and a positive gradient-noise estimate (6 steps leave it negative on tp2)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_env(**extra: str) -> dict[str, str]:
    """Environment of a launched run: one thread per rank, gloo on loopback, the repo importable."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def mindpipe(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``mindpipe ARGS...`` in a subprocess (the console script's module)."""
    return subprocess.run([sys.executable, "-m", "mindpipe.cli", *args], capture_output=True, text=True,
                          env=env or run_env(), timeout=timeout, cwd=REPO)


def run_plan(tmp: Path, plan: dict[str, Any], nproc: int, *extra: str, steps: int = STEPS,
             model: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``mindpipe run`` of ``plan`` on ``nproc`` local ranks, writing ``tmp/measured.json``.

    The run's temporary files (and the log a failed run keeps) go to ``tmp/tmp`` unless ``env``
    names a ``TMPDIR``, so failure tests leave nothing in the system's temporary directory.
    """
    env = dict(env or run_env())
    if "TMPDIR" not in env or env["TMPDIR"] == os.environ.get("TMPDIR"):
        (tmp / "tmp").mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp / "tmp")
    return mindpipe("run", json.dumps(plan), "--nproc", str(nproc), "--steps", str(steps),
                    "--model", json.dumps(model or TINY), "--out", str(tmp / "measured.json"),
                    "--run-timeout", "500", "--timeout", "120", *extra, env=env)


def launched_trace(tmp: Path, plan: dict[str, Any], model: dict[str, Any] | None = None, steps: int = STEPS) -> Any:
    """``run_plan`` of ``plan`` on its world size; the measured trace (the run must succeed)."""
    from mindpipe.traces.config import Plan
    from mindpipe.traces.trace import Trace

    res = run_plan(tmp, plan, Plan(**plan).world_size, model=model, steps=steps)
    assert res.returncode == 0, res.stderr[-4000:]
    return Trace.load(tmp / "measured.json")


@pytest.fixture()
def tiny4():
    """The tiny model as a contract object."""
    from mindpipe.traces.config import Model

    return Model(**TINY)


def assert_layer_times(trace: Any) -> None:
    """The measured trace's per-layer records are timed and complete.

    Every layer has a forward and a backward; under a split backward every layer outside the first
    stage has its own weight-gradient time (the first stage's whole backward runs in W and is named
    in the notes; an LM head fused into the loss takes its weight gradient in I); no phase went untimed. (That each action's layer segments add up to the action
    is exact and tested in test_exec_layer_timing; medians of busy-machine wall times are not
    compared here.)
    """
    from mindpipe.traces.layout import stage_layout

    m = trace.measurement
    notes = trace.provenance.notes
    assert "not timed per layer" not in notes and "timed inside each action" in m.layer_times, notes
    layers = {r.name: r for r in trace.layers}
    assert all(r.forward_s > 0 and r.backward_input_s > 0 for r in trace.layers), trace.layers
    for span in stage_layout(m.plan, trace.model):
        names = span.layer_names()
        assert all(layers[n].stats and layers[n].stats["forward_samples"] > 0 for n in names)
        if trace.backward_split == "measured":
            fused = m.plan.fused_head_loss
            assert all((layers[n].backward_weight_s > 0) == (span.stage != 0 and not (fused and n == "lm_head"))
                       for n in names), (span, notes)


def stage_saved_activations(model: Any, plan: Any) -> tuple[int, Any]:
    """Build pipeline stage 0 of ``model`` under ``plan`` (its block policies, its ``flash_attention``)
    in process, run one micro-batch forward and its loss (the plan's ``loss_chunks``) and backward
    under the executor's live-tensor accounting, and return (activation bytes held when the forward
    ended, the :class:`MemoryAccount`)."""
    import torch
    from mindpipe.executor.memory_account import MemoryAccount
    from mindpipe.executor.offload import HostPool
    from mindpipe.executor.parallelize import apply_recompute
    from mindpipe.executor.stages import build_stage_modules
    from mindpipe.traces.layout import block_policies
    from mindpipe.traces.torch_gpt import plan_loss, synthetic_batch
    from mindpipe.traces.torch_models import build_model

    cpu = torch.device("cpu")
    mod = build_stage_modules(build_model(model, seed=0, flash_attention=plan.flash_attention), plan, 0)[0]
    memory = MemoryAccount([mod], cpu, "pipeline rank 0 (stages [0])", None)
    apply_recompute(mod, block_policies(plan, model.num_layers), HostPool(cpu), memory)
    memory.count_weights()
    x, y = synthetic_batch(model, plan.micro_batch_size, seed=1)
    with memory.saving(1):
        loss = plan_loss(plan)(mod(x), y)
        held = memory.terms.activations
        loss.backward()
    return held, memory
