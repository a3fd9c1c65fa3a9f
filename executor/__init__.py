"""torch.distributed runtime of a plan: DeviceMesh, DTensor TP, pipelining, FSDP2; measurement.

``mindpipe run PLAN --nproc N --steps S`` (:mod:`executor.launch`) validates the plan
(:mod:`executor.precheck`) and starts torchrun; every rank runs ``python -m executor``
(:mod:`executor.worker`), which builds the GPT of :mod:`traces.torch_gpt`, cuts it into pipeline
stages (:mod:`executor.stages`), applies TP → recompute → DP (:mod:`executor.parallelize`), runs
torch's schedule or the simulator's action table (:mod:`executor.pipeline`,
:mod:`executor.torch_pipelining`), times every action (:mod:`executor.measure`), checkpoints with
DCP (:mod:`executor.checkpoint`) and writes the measured trace (:mod:`executor.report`,
:mod:`traces.measured`).

Importing this package (and :mod:`executor.config`, :mod:`executor.precheck`,
:mod:`executor.launch`) does not import torch; the modules that run training do.
"""
