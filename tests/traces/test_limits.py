"""Stated limits (:mod:`mindpipe.traces.limits`): checked by the contracts, named in messages, listed in the README."""

from __future__ import annotations

from pathlib import Path

import pytest
from mindpipe.traces.builtin import load_cluster
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import LIMITS, limit, limits_table

GPT = {"kind": "gpt", "num_layers": 4, "hidden_size": 256, "num_heads": 8, "seq_len": 128, "vocab_size": 2048}


@pytest.mark.parametrize("key", ["num_layers", "hidden_size", "seq_len", "vocab_size", "ffn_hidden_size"])
def test_model_sizes_past_their_limit_are_refused_naming_it(key):
    at = dict(GPT, **{key: limit(key)}) if key != "hidden_size" else dict(GPT, hidden_size=limit(key))
    Model(**at)  # the limit itself is allowed
    with pytest.raises(ContractError, match=rf"^{key}={limit(key) + 8} exceeds the limit of [0-9,]+ "):
        Model(**dict(GPT, **{key: limit(key) + 8}))


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"dp": 2**17 + 1}, "dp=131073 exceeds the limit of 131,072 devices"),
    ({"dp": 2**9, "tp": 2**9}, "dp×tp×pp=262144 exceeds the limit of 131,072 devices"),
    ({"global_batch_size": 2**14 + 1}, "m=16385 exceeds the limit of 16,384 micro-batches"),
    ({"pp": 16, "global_batch_size": 2**14}, "m×pp×virtual_stages=262144 exceeds the limit of 131,072"),
    ({"micro_batch_size": 2**16 + 1, "global_batch_size": 2**16 + 1}, "micro_batch_size=65537 exceeds"),
    ({"virtual_stages": 65, "schedule": "interleaved_1f1b"}, "virtual_stages=65 exceeds the limit of 64"),
    ({"pp": 2, "global_batch_size": 2, "partition": ["a", "b"]}, "partition[0]='a' must be an integer"),
    ({"pp": 2, "global_batch_size": 2, "partition": [1, True]}, "partition[1]=True must be an integer"),
    ({"dp": True}, "dp=True must be an integer"),
    ({"dp": "2"}, "dp='2' must be an integer"),
    ({"dp": 2.0}, "dp=2.0 must be an integer"),
    ({"sequence_parallel": "yes", "tp": 2}, "sequence_parallel='yes' must be true or false"),
    ({"zero_stage": True}, "zero_stage=True must be 0, 1, 2 or 3"),
    ({"schedule": ["1f1b"]}, "schedule=['1f1b'] is not one of"),
    ({"layer_memory_policy": "keep"}, "layer_memory_policy='keep' must be a list"),
])
def test_plans_built_in_python_get_one_line_errors(kwargs, needle):
    with pytest.raises(ContractError) as e:
        Plan(**kwargs)
    assert needle in str(e.value)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"num_nodes": 16385}, "num_nodes=16385 exceeds the limit of 16,384 nodes"),
    ({"num_nodes": 1024, "gpus_per_node": 1024}, "num_nodes×gpus_per_node=1048576 exceeds the limit"),
    ({"pue": float("nan")}, "pue=nan must be a finite number"),
    ({"pue": 11.0}, "pue=11.0 exceeds the limit of 10"),
    ({"inter_node_bandwidth_Gbps": 1e300}, "exceeds the limit of 1e+06 GB/s or Gbit/s"),
    ({"gpus_per_node": "8"}, "gpus_per_node='8' must be an integer"),
])
def test_clusters_past_their_limits(kwargs, needle):
    with pytest.raises(ContractError) as e:
        Cluster(gpu="a100-sxm4-80gb", **kwargs)
    assert needle in str(e.value)


def test_cluster_names_with_huge_counts_are_refused_without_parsing_them():
    with pytest.raises(ContractError, match="not a file and not DEVICE or DEVICE:NODESxPER_NODE"):
        load_cluster("a100-sxm4-80gb:" + "9" * 5000 + "x8")
    with pytest.raises(ContractError, match="num_nodes=999999999 exceeds the limit"):
        load_cluster("a100-sxm4-80gb:999999999x8")


def test_the_largest_allowed_plan_is_accepted():
    Plan(pp=8, global_batch_size=limit("micro_batches"))
    Plan(dp=limit("devices"), global_batch_size=limit("devices"))


def test_readme_lists_every_limit():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert limits_table() in readme
    assert len(LIMITS) == limits_table().count("\n| `")
