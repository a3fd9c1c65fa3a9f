"""Discrete-event simulator of parallel training (pure Python, never imports torch).

Entry point :func:`simulator.api.simulate` (model, cluster, plan → SimulationResult). Pieces:
:mod:`~simulator.schedules` (pure schedule functions: gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv,
dualpipev), :mod:`~simulator.action_table` (torch.distributed.pipelining CSV), :mod:`~simulator.engine`
(simpy replay of per-rank action lists), :mod:`~simulator.network` (fluid max-min link sharing with
priorities), :mod:`~simulator.topology` (Megatron rank placement, hierarchical collectives),
:mod:`~simulator.memory` (per-stage memory, ZeRO, recompute), :mod:`~simulator.energy` (energy and
carbon), :mod:`~simulator.costs` and :mod:`~simulator.perf` (compute and communication models),
:mod:`~simulator.timeline` (Chrome trace, Gantt).
"""
