"""Built-in model and cluster names, and the resolver the CLI uses for M, C and P arguments.

An argument may be a path to a JSON file, inline JSON (starting with ``{``) or a built-in name.
Clusters accept ``DEVICE`` (one node) or ``DEVICE:NODESxPER_NODE``, e.g. ``a100-sxm4-80gb:64x8``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from mindpipe.traces.catalog import device_names, get_device
from mindpipe.traces.config import Cluster, Model, Plan
from mindpipe.traces.errors import ContractError
from mindpipe.traces.reading import CONFIG, parse_json, read_json, size_text
from mindpipe.traces.schema import from_dict
from mindpipe.traces.supernet import Supernet
from mindpipe.traces.supernet_builtin import BUILTIN_SUPERNETS

T = TypeVar("T")

# Shapes from the GPT-3 paper (Brown et al. 2020, Table 2.1) and Megatron's GPT configs; the
# vocabulary is GPT-2's 50,257 padded to 51,200 as in DESIGN.md's example.
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    # Tiny, for CPU tests and the demo (a few ms per block on one core).
    "gpt-mini": {"kind": "gpt", "num_layers": 4, "hidden_size": 256, "num_heads": 8, "seq_len": 128, "vocab_size": 2048},
    # The demo's model: an 8k vocabulary whose LM head outweighs its four blocks, so an even pipeline
    # split leaves the last rank with most of the work (under half a second per step on 2 cores).
    "gpt-tiny-8k": {"kind": "gpt", "num_layers": 4, "hidden_size": 128, "num_heads": 8, "seq_len": 128,
                    "vocab_size": 8192},
    "gpt-1.3b": {"kind": "gpt", "num_layers": 24, "hidden_size": 2048, "num_heads": 16, "seq_len": 2048, "vocab_size": 51200},
    "gpt-13b": {"kind": "gpt", "num_layers": 40, "hidden_size": 5120, "num_heads": 40, "seq_len": 2048, "vocab_size": 51200},
    "gpt3-175b": {"kind": "gpt", "num_layers": 96, "hidden_size": 12288, "num_heads": 96, "seq_len": 2048, "vocab_size": 51200},
    # Tiny Llama for CPU tests: grouped-query attention (4 query heads share 2 K/V heads), SwiGLU
    # width ~8h/3 rounded up to a multiple of 64 (Meta's rule), so tp 2 splits heads, K/V heads and MLP.
    "llama-tiny": {"kind": "llama", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
                   "ffn_hidden_size": 192, "seq_len": 64, "vocab_size": 512, "rope_theta": 10000.0},
    # Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3) and Meta's Hugging Face
    # config.json files (meta-llama/Meta-Llama-3-8B, -70B, Llama-3.1-405B): num_hidden_layers,
    # hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size 128256,
    # rope_theta 500000, untied embeddings; pre-training sequence length 8192.
    "llama3-8b": {"kind": "llama", "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
                  "ffn_hidden_size": 14336, "seq_len": 8192, "vocab_size": 128256, "rope_theta": 500000.0},
    "llama3-70b": {"kind": "llama", "num_layers": 80, "hidden_size": 8192, "num_heads": 64, "num_kv_heads": 8,
                   "ffn_hidden_size": 28672, "seq_len": 8192, "vocab_size": 128256, "rope_theta": 500000.0},
    "llama3.1-405b": {"kind": "llama", "num_layers": 126, "hidden_size": 16384, "num_heads": 128, "num_kv_heads": 8,
                      "ffn_hidden_size": 53248, "seq_len": 8192, "vocab_size": 128256, "rope_theta": 500000.0},
    # Llama 3.2 1B and 3B (Meta's config.json for meta-llama/Llama-3.2-1B and -3B): the LM head is
    # tied to the token table (tie_word_embeddings), rope_theta 500000, vocabulary 128256.
    "llama3.2-1b": {"kind": "llama", "num_layers": 16, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 8,
                    "ffn_hidden_size": 8192, "seq_len": 8192, "vocab_size": 128256, "rope_theta": 500000.0,
                    "tie_embeddings": True},
    "llama3.2-3b": {"kind": "llama", "num_layers": 28, "hidden_size": 3072, "num_heads": 24, "num_kv_heads": 8,
                    "ffn_hidden_size": 8192, "seq_len": 8192, "vocab_size": 128256, "rope_theta": 500000.0,
                    "tie_embeddings": True},
}

# Named clusters: the machines of published measurements, sized by ``NAME:NODESxPER_NODE``.
# ``vtrain-a100``: vTrain's A100 runs (MICRO'24; VIA-Research/vTrain config/validation): 8 GPUs per
# node, 800 Gbit/s per node between nodes (80 GB parts; see simulator/perf/vtrain.py).
BUILTIN_CLUSTERS: dict[str, dict[str, Any]] = {
    "vtrain-a100": {"gpu": "a100-sxm4-80gb", "gpus_per_node": 8, "inter_node_bandwidth_Gbps": 800.0},
}

# Devices per node when a cluster is named by its device alone.
_DEFAULT_PER_NODE = {"cpu": 2}
# Bounded digit counts: the cluster limits (traces.config.LIMITS) refuse what is too large, with a message.
_CLUSTER_RE = re.compile(r"^(?P<dev>[A-Za-z0-9._-]{1,64}?)(?::(?P<nodes>\d{1,9})x(?P<per>\d{1,9}))?$")


def model_names() -> list[str]:
    """Names accepted by :func:`load_model`."""
    return sorted(BUILTIN_MODELS)


def config_source(arg: str, kind: str) -> str:
    """How errors name a model, cluster or plan argument: ``<inline plan>`` for inline JSON, else the argument."""
    text = str(arg).strip()
    return f"<inline {kind}>" if text.startswith("{") else text


Arg = str | os.PathLike[str] | Mapping[str, Any]
"""What a loader takes besides the object itself: a name, a file, inline JSON text or a dict (Python)."""


def _parse_arg(arg: Arg, kind: str) -> tuple[Any, str] | None:
    """Return (parsed JSON, source) for a file path, inline JSON or a dict, or None for a bare name.

    A key given twice is refused (JSON would keep the last one silently): these files are written by hand.

    Raises:
        ContractError: ``arg`` is none of those (from Python: e.g. None or a number).
    """
    if isinstance(arg, Mapping):
        return dict(arg), f"<{kind} dict>"
    if isinstance(arg, os.PathLike):
        return read_json(os.fspath(arg), CONFIG, unique_keys=True), config_source(os.fspath(arg), kind)
    if not isinstance(arg, str):
        raise ContractError(f"<{kind}>", None, f"a {kind} is a built-in name, a file, JSON text, a dict or a "
                                               f"{kind.capitalize()} object, not {type(arg).__name__}")
    text = str(arg).strip()
    source = config_source(arg, kind)
    if text.startswith("{"):
        if len(text.encode("utf-8", "surrogatepass")) > CONFIG.max_bytes:
            raise ContractError(source, None, f"inline JSON is longer than {size_text(CONFIG.max_bytes)} (limit)")
        return parse_json(text, source, unique_keys=True), source
    if text.endswith((".json", ".json.gz")) or "/" in text or _exists(text):
        return read_json(text, CONFIG, unique_keys=True), source
    return None


def _exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


_NOT_HERE = "kind='supernet': this command takes a GPT model (kind \"gpt\") or a Llama model (kind \"llama\"), not a supernet"


def load_model(arg: Arg | Model) -> Model:
    """Resolve a model argument (file, inline JSON, a dict or built-in name)."""
    if isinstance(arg, Model):
        return arg
    parsed = _parse_arg(arg, "model")
    if parsed is not None:
        if isinstance(parsed[0], dict) and parsed[0].get("kind") == "supernet":
            raise ContractError(parsed[1], "kind", _NOT_HERE)
        return from_dict(Model, *parsed)
    name = str(arg).strip().lower()
    if name in BUILTIN_SUPERNETS:
        raise ContractError(str(arg), None, f"{name} is a built-in supernet; {_NOT_HERE}")
    if name not in BUILTIN_MODELS:
        raise ContractError(str(arg), None, f"not a file and not a built-in model (built-ins: {', '.join(model_names())})")
    return from_dict(Model, {**BUILTIN_MODELS[name], "name": name}, f"built-in model {name}")


def load_network(arg: Arg | Model | Supernet) -> Model | Supernet:
    """Resolve a model argument that may name a GPT model or a supernet (file, inline JSON or built-in)."""
    if isinstance(arg, Model | Supernet):
        return arg
    parsed = _parse_arg(arg, "model")
    if parsed is not None:
        data, source = parsed
        if isinstance(data, dict) and data.get("kind") == "supernet":
            return from_dict(Supernet, data, source)
        return from_dict(Model, data, source)
    name = str(arg).strip().lower()
    if name in BUILTIN_SUPERNETS:
        return from_dict(Supernet, {**BUILTIN_SUPERNETS[name], "name": name}, f"built-in supernet {name}")
    if name not in BUILTIN_MODELS:
        names = ", ".join(sorted([*BUILTIN_MODELS, *BUILTIN_SUPERNETS]))
        raise ContractError(str(arg), None, f"not a file and not a built-in model or supernet (built-ins: {names})")
    return load_model(arg)


def load_supernet(arg: Arg | Supernet) -> Supernet:
    """Resolve a supernet argument (file, inline JSON or built-in name such as ``supernet-mini``).

    Raises:
        ContractError: not a supernet (e.g. a GPT model), or a contract rule broken.
    """
    net = load_network(arg)
    if not isinstance(net, Supernet):
        raise ContractError(str(arg), "kind", f"kind={net.kind!r}: a supernet (kind \"supernet\") is needed here")
    return net


def load_cluster(arg: Arg | Cluster) -> Cluster:
    """Resolve a cluster argument (file, inline JSON, a dict, ``DEVICE`` or ``DEVICE:NxG``)."""
    if isinstance(arg, Cluster):
        return arg
    parsed = _parse_arg(arg, "cluster")
    if parsed is not None:
        return from_dict(Cluster, *parsed)
    m = _CLUSTER_RE.match(str(arg).strip())
    if m is None:
        raise ContractError(str(arg), None, "not a file and not DEVICE or DEVICE:NODESxPER_NODE (e.g. a100-sxm4-80gb:64x8)")
    named = BUILTIN_CLUSTERS.get(m["dev"].lower())
    if named is not None:
        data = {**named, "name": str(arg).strip()}
        if m["nodes"]:
            data.update(num_nodes=int(m["nodes"]), gpus_per_node=int(m["per"]))
        return from_dict(Cluster, data, f"cluster {arg}")
    try:
        device = get_device(m["dev"]).name
    except ContractError:
        raise ContractError(
            str(arg), None, f"not a file and not a known device (devices: {', '.join(device_names())})"
        ) from None
    nodes = int(m["nodes"]) if m["nodes"] else 1
    per = int(m["per"]) if m["per"] else _DEFAULT_PER_NODE.get(device, 8)
    data = {"gpu": device, "num_nodes": nodes, "gpus_per_node": per, "name": str(arg).strip()}
    return from_dict(Cluster, data, f"cluster {arg}")


def load_plan(arg: Arg | Plan) -> Plan:
    """Resolve a plan argument (file, inline JSON or a dict)."""
    if isinstance(arg, Plan):
        return arg
    parsed = _parse_arg(arg, "plan")
    if parsed is None:
        raise ContractError(str(arg), None, "plan must be a JSON file or inline JSON object")
    return from_dict(Plan, *parsed)
