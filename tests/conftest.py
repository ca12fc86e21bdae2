"""Fixtures shared by several test modules.

The suite has two folders: ``tests/library`` (the pipelines, models, schedulers and the loop: ``pytest tests/library``
runs them alone) and ``tests/lab`` (command line, benchmarks, counters, calibration, the shapes world, the web page);
the repository checks (style, docs site) sit here. The shared helpers (``registry_lists``, ``toy_family``,
``fixture_utils``) live in this folder and every test module imports them by name.
"""

import os
import sys
from pathlib import Path

# the shared helpers (this folder) and the test modules one folder down import each other by module name
for _folder in (Path(__file__).parent, Path(__file__).parent / "library", Path(__file__).parent / "lab"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import huggingface_hub.constants  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the README's command runs two workers on two cores: one intra-op thread each, as more only oversubscribe them
    torch.set_num_threads(1)


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


def tiny_hart_patch_nums():
    """The tiny HART schedule the method tests run: the first 10 scales of HART-0.7B's."""
    from diffusers_var_accel.models.transformer_hart import HART_CONFIGS

    return HART_CONFIGS["hart-0.7b"]["patch_nums"][:10]


@pytest.fixture(scope="module")
def pipes():
    """``pipes(family)``: the tiny pipeline of each family (a 6-block Infinity, a 4-block HART on the first 10
    HART-0.7B scales), built on first use and shared by the module's tests."""
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    built = {}

    def get(family):
        if family not in built:
            if family == "infinity":
                pipe = build_tiny_infinity_pipeline(seed=0, depth=6)  # FastVAR's preset layers 3.. exist
            else:
                pipe = build_tiny_hart_pipeline(
                    seed=0, depth=4, embed_dim=32, patch_nums=tiny_hart_patch_nums(), tokenizer_ch_mult=(1,)
                )
            pipe.set_progress_bar_config(disable=True)
            built[family] = pipe
        return built[family]

    return get
