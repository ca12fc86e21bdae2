"""The acceleration summary against the FLOP counter, and ``var-accel generate --summary``.

The bench's FLOP counter reads each pass's FLOPs during the call (between two scale callbacks): a pass the summary
says was skipped counted none, and a pass whose layers computed fewer tokens than the baseline's counted fewer FLOPs
than the baseline's same pass; the CLI prints one table line per pass and the counted FLOPs.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel.lab.bench.probe import make_flop_counter
from diffusers_var_accel.lab.cli import main
from registry_lists import tiny_preset

HW = {"height": 144, "width": 432}


def flops_per_pass(pipe, scheduler):
    """FLOPs counted between scale callbacks (one entry per pass that reached a callback) and the summary."""
    counter = make_flop_counter()
    marks = []

    def on_scale(p, scale_index, scale, values):
        marks.append((scale_index, int(counter.get_total_flops())))
        return {}

    with counter:
        pipe(
            "a fox",
            generator=torch.Generator().manual_seed(0),
            acceleration=scheduler,
            output_type="latent",
            callback_on_step_end=on_scale,
            **HW,
        )
    per_scale, last = {}, 0
    for scale_index, total in marks:
        per_scale[scale_index] = total - last
        last = total
    return per_scale, pipe.acceleration_summary()


@pytest.mark.parametrize("method", ["fastvar", "depthvar"])
def test_the_summary_agrees_with_the_flop_counter(method, pipes):
    pipe = pipes("infinity")
    baseline_flops, baseline = flops_per_pass(pipe, None)
    flops, summary = flops_per_pass(pipe, tiny_preset(method, "infinity"))
    assert any(p["skipped"] for p in summary["passes"]) or summary["token_layers"] < summary["baseline_token_layers"]
    for p, base in zip(summary["passes"], baseline["passes"]):
        first = p["scales"][0]
        if p["skipped"]:
            assert flops[first] == 0, first
        elif sum(p["tokens_computed_per_layer"]["self_attn"]) < sum(base["tokens_computed_per_layer"]["self_attn"]):
            assert flops[first] < baseline_flops[first], first
        else:
            assert flops[first] == baseline_flops[first], first


def test_generate_summary_prints_a_line_per_pass_and_the_flops(tmp_path, capsys):
    assert (
        main(
            [
                "generate",
                "a red circle",
                "--model",
                "tiny-hart",
                "--accel",
                "lazyvar",
                "--summary",
                "--no-progress",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("pass  scales"))
    passes = [line for line in lines[header + 1 :] if line[:4].strip().isdigit()]
    assert len(passes) == 7 and "grouped" in passes[-1]  # HART's tiny schedule: LazyVAR groups its last scales
    assert "token-layers computed:" in out and "KV cache:" in out
    assert "FLOPs (counted):" in out and "x fewer" in out
