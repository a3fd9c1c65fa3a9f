"""Search over 4D plans with the simulator as cost function (never imports torch).

Modules: :mod:`mindpipe.tuner.keys` (plan keys, what-if knobs, ``--fix``/``--what-if``, a point's
plan), :mod:`mindpipe.tuner.rules` (reason codes of rejected combinations),
:mod:`mindpipe.tuner.space` (the valid plans of a model and cluster), :mod:`mindpipe.tuner.partition`
(``even``, PipeDream's dynamic program, balanced min-max), :mod:`mindpipe.tuner.materialize` and
:mod:`mindpipe.tuner.evaluate` (a point → a partitioned plan → memory check → simulation),
:mod:`mindpipe.tuner.records` (typed evaluation and scored records), :mod:`mindpipe.tuner.objectives`
(throughput, energy, carbon, goodput, constraints, Pareto front), :mod:`mindpipe.tuner.optimizers`
(``grid``, ``random``, ``bo``), :mod:`mindpipe.tuner.sweep` and :mod:`mindpipe.tuner.store`
(parallel, resumable sweeps), :mod:`mindpipe.tuner.output` (tables, best plan with ``made_for``,
plots) and :mod:`mindpipe.tuner.api` (:func:`mindpipe.tuner.api.tune`, which ``mindpipe tune`` wraps).
Supernets (NASPipe) use the same sweep: :mod:`mindpipe.tuner.subnet_space` (their points),
:mod:`mindpipe.tuner.subnet_partition` (``even``, ``balanced`` over the expected stage time) and
:mod:`mindpipe.tuner.subnet_evaluate` (a point → a partitioned plan → subnets per hour).
"""
