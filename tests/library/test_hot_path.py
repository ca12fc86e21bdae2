"""A reader follows one dense pass from the loop to the attention kernel in a few frames, as in VAR: the loop, its
pass, the family's blocks, the transformer, the block (which writes its residual stream), the attention module and
its processor. Counted from the Python stack at the first attention call inside the loop."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import diffusers_var_accel
from diffusers_var_accel.models import attention_processor

PACKAGE_DIR = os.path.dirname(os.path.abspath(diffusers_var_accel.__file__))
#: The most frames of the package between the loop and the attention kernel, the loop's own included.
MOST_FRAMES = 8


def _first_attention_stack_in_the_loop(pipe, monkeypatch, **call):
    stacks = []
    real = attention_processor.dispatch_attention_fn

    def spy(*args, **kwargs):
        if not stacks:
            frames = [(os.path.abspath(f.filename), f.function) for f in inspect.stack()[1:]]
            if any(function == "run_next_scale_loop" for _, function in frames):
                stacks.append(frames)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention_processor, "dispatch_attention_fn", spy)
    pipe("a fox", generator=torch.Generator().manual_seed(0), output_type="latent", **call)
    frames = [(os.path.relpath(f, PACKAGE_DIR), fn) for f, fn in stacks[0] if f.startswith(PACKAGE_DIR + os.sep)]
    loop = next(i for i, (_, function) in enumerate(frames) if function == "run_next_scale_loop")
    return list(reversed(frames[: loop + 1]))


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_a_dense_pass_reaches_the_attention_kernel_in_a_few_frames(family, pipes, monkeypatch):
    pipe = pipes(family)
    call = {"height": 256, "width": 256} if family == "infinity" else {}
    frames = _first_attention_stack_in_the_loop(pipe, monkeypatch, **call)
    assert len(frames) <= MOST_FRAMES, frames
    files = [f for f, _ in frames]
    assert files[0] == os.path.join("next_scale", "loop.py")
    assert files[-1] == os.path.join("models", "attention_processor.py")
    # the block writes its residual stream: the attention module is called from the block's own forward
    assert [fn for _, fn in frames].count("forward") >= 3  # transformer, block, attention module
