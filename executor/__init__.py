"""torch.distributed runtime of a plan: DeviceMesh, DTensor TP, pipelining, FSDP2; measurement.

``mindpipe run PLAN --nproc N --steps S`` (:mod:`mindpipe.executor.launch`) validates the plan
(:mod:`mindpipe.executor.precheck`) and starts torchrun; every rank runs ``python -m mindpipe.executor``
(:mod:`mindpipe.executor.worker`), which builds the GPT of :mod:`mindpipe.traces.torch_gpt`, cuts it into pipeline
stages (:mod:`mindpipe.executor.stages`), applies TP → recompute → DP (:mod:`mindpipe.executor.parallelize`), runs
torch's schedule or the simulator's action table (:mod:`mindpipe.executor.pipeline`,
:mod:`mindpipe.executor.torch_pipelining`), times every action (:mod:`mindpipe.executor.measure`), checkpoints with
DCP (:mod:`mindpipe.executor.checkpoint`) and writes the measured trace (:mod:`mindpipe.executor.report`,
:mod:`mindpipe.traces.measured`).

Importing this package (and :mod:`mindpipe.executor.config`, :mod:`mindpipe.executor.precheck`,
:mod:`mindpipe.executor.launch`) does not import torch; the modules that run training do.
"""
