"""MindPipe data contracts, hardware catalog, profiler and importers.

Importing this package never imports torch (the simulator depends on it and stays torch-free);
the torch parts (``traces.torch_gpt``, ``traces.profiler``, ``traces.op_graph``) are imported
explicitly by the code that needs them.
"""

from mindpipe.traces.config import Cluster, Model, Plan, check_plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.result import SimulationResult
from mindpipe.traces.trace import CommRecord, LayerRecord, Provenance, Trace

__all__ = ["Cluster", "CommRecord", "ContractError", "LayerRecord", "Model", "Plan", "Provenance", "SimulationResult", "Trace", "check_plan"]
