"""Shared fixtures: the published data beside the repo, a tiny model, GPU skipping."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when no CUDA device is present."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (published measurements); tests that need it fail loudly if absent."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"published data not found at {SHARED_DATA} (CI checks out shared/ beside the repo)")
    return SHARED_DATA


@pytest.fixture()
def tiny_model():
    """A model small enough to profile in well under a second."""
    from mindpipe.traces.config import Model

    return Model(kind="gpt", num_layers=2, hidden_size=64, num_heads=4, seq_len=32, vocab_size=128, name="tiny")
