"""Fixtures shared by several test modules."""

import huggingface_hub.constants
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and spinning OpenMP workers stall badly on a shared machine.

    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")`` or as an autouse wrapper in a module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A private, offline Hub cache: nothing can be downloaded, nothing outside tmp_path is read or written."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read from the env at import time
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache
