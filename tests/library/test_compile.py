"""``torch.compile(pipe.transformer)`` with acceleration off and on (issue 8, ecosystem behaviour).

The ``aot_eager`` backend traces the same graphs as inductor (TorchDynamo + AOTAutograd) without generating C++, so
the test checks graph capture and results on a CPU in seconds; inductor is the same capture plus code generation.
"""

import pytest
import torch

from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from diffusers_var_accel.schedulers.specs import load_acceleration

PROMPT = "a blue square to the left of a yellow triangle"


def generate(pipe, method):
    acceleration = load_acceleration(method, "infinity")  # None for "baseline"
    return pipe(
        PROMPT,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        acceleration=acceleration,
        **EMBEDDED_SAMPLING,
    ).images


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_transformer_matches_eager_with_acceleration_off_and_on():
    from torch._dynamo.utils import counters

    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    eager = {name: generate(pipe, name) for name in ("baseline", "lazyvar", "fastvar")}
    assert not torch.equal(eager["baseline"], eager["lazyvar"])  # the methods change the image: the checks below bite

    counters.clear()
    pipe.transformer = torch.compile(pipe.transformer, backend="aot_eager")
    for name, image in eager.items():
        compiled = generate(pipe, name)
        assert torch.allclose(compiled, image, atol=1e-5), name
    assert counters["stats"]["unique_graphs"] > 0  # the transformer really ran through TorchDynamo
