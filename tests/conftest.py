"""Shared fixtures: the published data beside the repo, a tiny model, GPU skipping."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files that hold ``slow`` tests first, and skip tests marked ``gpu`` without CUDA.

    ``make test`` spreads whole files over two pytest-xdist workers (``--dist loadfile``); a slow
    file handed out last would run alone while the other worker idles. The sort is stable, so the
    order inside a file (and its module fixtures) is unchanged.
    """
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)
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
