"""Discrete-event simulator of parallel training (pure Python, never imports torch).

Entry point :func:`mindpipe.simulator.api.simulate` (model, cluster, plan → SimulationResult). Pieces:
:mod:`~mindpipe.simulator.schedules` (pure schedule functions: gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv,
dualpipev), :mod:`~mindpipe.simulator.action_table` (torch.distributed.pipelining CSV), :mod:`~mindpipe.simulator.engine`
(simpy replay of per-rank action lists), :mod:`~mindpipe.simulator.network` (fluid max-min link sharing with
priorities), :mod:`~mindpipe.simulator.topology` (Megatron rank placement, hierarchical collectives),
:mod:`~mindpipe.simulator.memory` (per-stage memory, ZeRO, recompute), :mod:`~mindpipe.simulator.energy` (energy and
carbon), :mod:`~mindpipe.simulator.costs` and :mod:`~mindpipe.simulator.perf` (compute and communication models),
:mod:`~mindpipe.simulator.timeline` (Chrome trace, Gantt).
"""
