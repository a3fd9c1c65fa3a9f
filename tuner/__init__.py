"""Search over 4D plans with the simulator as cost function (never imports torch).

Modules: :mod:`tuner.space` (the valid plans of a model and cluster, ``--fix``), :mod:`tuner.partition`
(``even``, PipeDream's dynamic program, balanced min-max), :mod:`tuner.materialize` and
:mod:`tuner.evaluate` (a point → a partitioned plan → memory check → simulation),
:mod:`tuner.objectives` (throughput, energy, carbon, goodput, constraints, Pareto front),
:mod:`tuner.optimizers` (``grid``, ``random``, ``bo``), :mod:`tuner.sweep` and :mod:`tuner.store`
(parallel, resumable sweeps), :mod:`tuner.output` (tables, best plan, plots) and :mod:`tuner.api`
(:func:`tuner.api.tune`, which ``mindpipe tune`` wraps).
"""
