"""Why a combination of plan keys is not a plan: one code per rule, the wording derived from it.

The rules themselves have owners elsewhere — the :class:`~mindpipe.traces.config.Plan` contract
(batch multiple, virtual stages per schedule, sequence parallelism needs tp > 1, context
parallelism needs FlashAttention),
:func:`~mindpipe.traces.config.check_plan` (heads, layers, mesh, micro-batches per schedule) and
:func:`~mindpipe.simulator.schedules.schedule_rule` (the schedules' own micro-batch rules, which
:func:`~mindpipe.traces.schedule_rules.microbatch_rule` and ``virtual_stages_rule`` own). The
tuner asks them and turns what they reject into a :class:`Rule` from the *key* the owner names
(:func:`rule_of`), never from the message. Only the rules the search space adds on top (TP stays
inside a node; values outside ``--fix``) are the space's own.
"""

from __future__ import annotations

from enum import StrEnum

from mindpipe.traces.errors import ContractError
from mindpipe.tuner.keys import CLI_ARG_NAMES, ArgNames


class Rule(StrEnum):
    """A broken plan rule (the code counted in ``rejected_by_rule`` and carried by invalid evaluations)."""

    MESH = "mesh"
    TP_PER_NODE = "tp_per_node"
    HEADS = "heads"
    LAYERS = "layers"
    BATCH_MULTIPLE = "batch_multiple"
    SCHEDULE = "schedule"
    VIRTUAL_STAGES = "virtual_stages"
    SEQUENCE_PARALLEL = "sequence_parallel"
    CONTEXT_PARALLEL = "context_parallel"
    PINNED = "pinned"
    PARTITION = "partition"
    MEMORY_POLICY = "memory_policy"
    PLAN = "plan"

    @property
    def text(self) -> str:
        """The rule in words (generic: no numbers of one combination), naming ``mindpipe tune``'s flags."""
        return self.said(CLI_ARG_NAMES)

    def said(self, arg_names: ArgNames) -> str:
        """:attr:`text`, naming the arguments as ``arg_names`` does (``--fix`` or ``fixes``)."""
        return _TEXT[self].format(fix=arg_names.name("--fix"))


_TEXT = {
    Rule.MESH: "dp·tp·pp·cp must equal the device count",
    Rule.TP_PER_NODE: "tp must not exceed devices per node",
    Rule.HEADS: "tp must divide num_heads, num_kv_heads and ffn_hidden_size",
    Rule.LAYERS: "pp×virtual_stages must not exceed num_layers",
    Rule.BATCH_MULTIPLE: "global batch must be a multiple of micro-batch×dp",
    Rule.SCHEDULE: "the schedule's micro-batch rules (m ≥ pp; interleaved_1f1b: m a multiple of pp; "
                   "zb_h1: m a multiple of max(1, m // pp); dualpipev: m ≥ 2·pp)",
    Rule.VIRTUAL_STAGES: "the schedule fixes virtual_stages (1 for gpipe, 1f1b, zb_h1; 2 for zbv, dualpipev)",
    Rule.SEQUENCE_PARALLEL: "sequence_parallel needs tp > 1 dividing seq_len (seq_len/cp under cp)",
    Rule.CONTEXT_PARALLEL: "cp > 1 needs flash_attention=true and 2·cp dividing seq_len; cp_comm_type=p2p needs cp > 1",
    Rule.PINNED: "outside the values pinned by {fix}",
    Rule.PARTITION: "the pinned partition needs pp×virtual_stages entries summing to num_layers",
    Rule.MEMORY_POLICY: "the pinned layer_memory_policy needs one entry per layer",
    Rule.PLAN: "another rule of the plan contract",
}

# The key a rule's owner names when it rejects a plan → the rule. ``global_batch_size`` is the
# batch multiple when the Plan contract refuses it, and the schedule's micro-batch count when
# check_plan does (both name that key).
_CHECK_RULES = {
    "dp": Rule.MESH, "tp": Rule.HEADS, "pp": Rule.LAYERS, "sequence_parallel": Rule.SEQUENCE_PARALLEL,
    "cp": Rule.CONTEXT_PARALLEL, "cp_comm_type": Rule.CONTEXT_PARALLEL,
    "partition": Rule.PARTITION, "layer_memory_policy": Rule.MEMORY_POLICY, "global_batch_size": Rule.SCHEDULE,
    "num_microbatches": Rule.SCHEDULE, "schedule": Rule.SCHEDULE, "virtual_stages": Rule.VIRTUAL_STAGES,
}
_CONTRACT_RULES = dict(_CHECK_RULES, global_batch_size=Rule.BATCH_MULTIPLE)


def rule_of(error: ContractError, *, contract: bool = False) -> Rule:
    """The rule an owner's ContractError reports, from the key it names.

    Args:
        error: Raised by ``check_plan`` (or the simulator's check), or by the Plan contract.
        contract: The Plan contract raised it (constructing the plan), not ``check_plan``.
    """
    key = (error.key or "").split("[", 1)[0].split(".", 1)[0]
    return (_CONTRACT_RULES if contract else _CHECK_RULES).get(key, Rule.PLAN)


__all__ = ["Rule", "rule_of"]
