"""torch.distributed runtime of a plan: DeviceMesh, DTensor TP, pipelining, FSDP2; measurement.

``mindpipe run PLAN --nproc N --steps S`` (:mod:`mindpipe.executor.launch`) validates the plan
(:mod:`mindpipe.executor.precheck`) and starts torchrun; every rank runs ``python -m mindpipe.executor``
(:mod:`mindpipe.executor.worker`), which builds the GPT of :mod:`mindpipe.traces.torch_gpt`, cuts it into pipeline
stages (:mod:`mindpipe.executor.stages`), applies TP → recompute → DP (:mod:`mindpipe.executor.parallelize`), runs
torch's schedule or the simulator's action table (:mod:`mindpipe.executor.pipeline`,
:mod:`mindpipe.executor.torch_pipelining`), times every action (:mod:`mindpipe.executor.measure`) and every
layer inside it (:mod:`mindpipe.executor.layer_timing`), checkpoints with DCP
(:mod:`mindpipe.executor.checkpoint`), gathers typed payloads to rank 0 (:mod:`mindpipe.executor.payload`) and
writes the measured trace (:mod:`mindpipe.executor.report`, :mod:`mindpipe.executor.layer_records`,
:mod:`mindpipe.traces.measured`).

Measured means measured: the executor's numbers come from timing and allocator/tensor accounting,
never from a cost model. It imports from the simulator only the pure schedule modules
(``schedules``, ``actions``, ``action_table``); the memory pre-check's model is injected by the
caller (``mindpipe run``), see :mod:`mindpipe.executor.precheck`.

Importing this package (and :mod:`mindpipe.executor.config`, :mod:`mindpipe.executor.precheck`,
:mod:`mindpipe.executor.launch`) does not import torch; the modules that run training do.
"""
