"""torch.distributed runtime of a plan (DeviceMesh, DTensor TP, pipelining, FSDP2).

Empty at this stage of the project: the executor arrives with issue 5. The GPT model it will run
already lives in :mod:`traces.torch_gpt`, shared with the profiler.
"""
