"""The kernel-launch and sync counter (``diffusers_var_accel.lab.bench.launches``, ``var-accel launches``).

Behaviour only (what is counted, where, and how the window is cut), never today's numbers: the syncs and kernels of
the models are being removed, so the counts will drop.
"""

import inspect
import json
from pathlib import Path

import pytest
import torch

from diffusers_var_accel.lab.bench.launches import (
    LaunchConfig,
    LaunchCounter,
    build_launch_pipeline,
    count_generation,
    count_launches,
    format_syncs,
    format_table,
)
from diffusers_var_accel.lab.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
SMALL = LaunchConfig(depth=2, size=256, hart_scales=6)


def _syncing_function(x):
    value = x.sum().item()  # line A
    upload = torch.tensor([1.0, 2.0])  # line B
    return value, upload


def test_a_known_sync_is_counted_with_its_source_line():
    lines, first = inspect.getsourcelines(_syncing_function)
    item_line = first + next(i for i, text in enumerate(lines) if "line A" in text)
    upload_line = first + next(i for i, text in enumerate(lines) if "line B" in text)
    with LaunchCounter() as counter:
        _syncing_function(torch.ones(3))
        torch.ones(2).tolist()
    total = counter.total()
    assert total.syncs == 3
    by_kind = {s["kind"]: s for s in counter.syncs_by_source()}
    assert by_kind["_local_scalar_dense"]["where"].endswith(f"test_launches.py:{item_line} (_syncing_function)")
    assert by_kind["upload (lift_fresh)"]["where"].endswith(f"test_launches.py:{upload_line} (_syncing_function)")
    assert ".tolist()" in by_kind and by_kind[".tolist()"]["count"] == 1


def test_half_precision_products_count_as_one_kernel_and_round_as_the_cpu_kernel_would():
    """The counter widens a bf16 product on a CPU to float32 (a CPU without bf16 instructions runs it ~200x slower):
    the count is the op as called, the value the float32 product rounded once, in the caller's dtype."""
    a, b = torch.randn(5, 7).bfloat16(), torch.randn(7, 3).bfloat16()
    image, weight = torch.randn(1, 2, 6, 6).bfloat16(), torch.randn(4, 2, 3, 3).bfloat16()
    with LaunchCounter() as counter:
        product = a @ b
        convolved = torch.nn.functional.conv2d(image, weight, padding=1)
    assert counter.total().kernels == 2 and dict(counter.kernel_names) == {"mm": 1, "convolution": 1}
    assert product.dtype == convolved.dtype == torch.bfloat16
    assert torch.equal(product, (a.float() @ b.float()).bfloat16())
    assert torch.equal(convolved, torch.nn.functional.conv2d(image.float(), weight.float(), padding=1).bfloat16())


def test_views_and_allocations_are_ops_but_not_kernels():
    x = torch.randn(4, 6)
    with LaunchCounter() as counter:
        x.view(6, 4)
        x.transpose(0, 1)
        x.reshape(2, 12)
        x[:, 1:3]
        x.unsqueeze(0).expand(3, 4, 6)
        torch.empty(5)
    assert counter.total().ops >= 6
    assert counter.total().kernels == 0
    with LaunchCounter() as counter:
        y = x * 2  # one kernel
        y.add_(1)  # an in-place op writes: a kernel
        x.transpose(0, 1).contiguous()  # the copy is a kernel, the transpose is not
    assert counter.total().kernels == 3
    assert counter.total().syncs == 0


def test_multinomial_counts_two_syncs_and_a_kernel():
    probs = torch.tensor([[0.2, 0.8]])
    with LaunchCounter() as counter:
        torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))
    assert counter.total().syncs == 2 and counter.total().kernels >= 1


def test_repeat_interleave_without_output_size_is_a_sync():
    x, repeats = torch.arange(3), torch.tensor([1, 2, 3])
    with LaunchCounter() as counter:
        x.repeat_interleave(repeats)
    assert [s["kind"] for s in counter.syncs_by_source()] == ["repeat_interleave"]
    with LaunchCounter() as counter:
        x.repeat_interleave(repeats, output_size=6)
    assert counter.total().syncs == 0


def test_idle_counter_counts_nothing_until_a_phase_is_set():
    with LaunchCounter(start_phase=None) as counter:
        torch.ones(3).sum().item()
        counter.set_phase("a")
        torch.ones(3).sum()
    assert counter.total().kernels == 2 and counter.total().syncs == 0
    assert set(counter.phases) == {"a"}


@pytest.fixture(scope="module")
def small_infinity():
    return build_launch_pipeline("infinity-2b", SMALL, torch.bfloat16)


def _inputs(pipe):
    return dict(
        prompt_embeds=torch.randn(1, 8, pipe.transformer.config.text_channels),
        height=256,
        width=256,
        generator=torch.Generator().manual_seed(0),
    )


def test_per_scale_counts_sum_to_the_total_and_the_window_excludes_the_condition(small_infinity):
    pipe = small_infinity
    result = count_generation(pipe, None, **_inputs(pipe))
    scales, _ = pipe.scale_schedule_for(256, 256)
    assert len(result["per_scale"]) == len(scales)
    for key in ("ops", "kernels", "syncs"):
        assert result[key] == sum(s[key] for s in result["per_scale"]) + result["decode"][key]
    assert all(s["kernels"] > 0 for s in result["per_scale"]) and result["decode"]["kernels"] > 0
    assert result["condition"]["ops"] > 0  # encode_condition was counted apart, outside the total
    assert sum(s["count"] for s in result["sync_sources"]) == result["syncs"]
    assert all(s["where"].startswith("diffusers_var_accel/") for s in result["sync_sources"])
    assert 0 < result["kernels_per_dense_block"] < result["per_scale"][-1]["kernels"]
    assert len(result["block_kernels_last_call"]) == len(pipe.transformer.blocks)
    assert result["kernels_per_dense_block"] in result["block_kernels_last_call"]
    assert sum(result["dense_block_kernel_ops"].values()) == result["kernels_per_dense_block"]
    # the counter leaves the pipeline as it was
    assert "encode_condition" not in vars(pipe.transformer)
    assert not pipe.transformer.blocks[0]._forward_hooks and not pipe.transformer.blocks[0]._forward_pre_hooks


def test_a_sync_in_the_loop_is_counted_and_one_in_the_text_stage_is_not(small_infinity, monkeypatch):
    pipe = small_infinity
    before = count_generation(pipe, None, **_inputs(pipe))
    block = pipe.transformer.blocks[1]
    original = type(block).forward

    def forward_with_a_sync(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        out.abs().max().item()  # outside the package: attributed to the package line that called the block
        return out

    monkeypatch.setattr(type(block), "forward", forward_with_a_sync)
    after = count_generation(pipe, None, **_inputs(pipe))
    monkeypatch.undo()
    passes = len(after["per_scale"])
    depth = len(pipe.transformer.blocks)
    assert after["syncs"] == before["syncs"] + passes * depth
    # the source is the innermost frame inside the package: here the transformer's line that calls the block
    added = [
        s for s in after["sync_sources"] if s["kind"] == "_local_scalar_dense" and s not in before["sync_sources"]
    ]
    assert sum(s["count"] for s in added) == passes * depth
    assert all(s["where"].startswith("diffusers_var_accel/models/transformer_infinity.py:") for s in added), added

    null_text_embeds, calls = pipe.transformer.null_text_embeds, []

    def null_text_with_a_sync(mask):
        calls.append(mask.shape)
        out = null_text_embeds(mask)
        out.abs().max().item()  # before encode_condition: the text stage, outside the window
        return out

    monkeypatch.setattr(pipe.transformer, "null_text_embeds", null_text_with_a_sync)
    text_stage = count_generation(pipe, None, **_inputs(pipe))
    assert calls and text_stage["syncs"] == before["syncs"]
    assert not any("null_text_with_a_sync" in s["where"] for s in text_stage["sync_sources"])


def test_count_launches_records_and_table(small_infinity):
    records = count_launches(["hart-0.7b"], ["baseline", "lazyvar"], config=SMALL)
    assert [(r["model"], r["method"]) for r in records] == [("hart-0.7b", "baseline"), ("hart-0.7b", "lazyvar")]
    assert all(r["num_scales"] == 6 and r["depth"] == 2 and r["cfg"] for r in records)
    table = format_table(records)
    assert table.splitlines()[0].startswith("| model | dtype | method | kernels")
    assert "hart-0.7b (2 blocks, 6 scales) | bfloat16 | lazyvar" in table
    assert "syncs" in format_syncs(records)
    # the KV cache at HART-0.7B's real width (1536) and depth (24), bf16, CFG, for the 6 scales counted: 300 context
    # tokens and the scales read by a later pass (all but the last); LazyVAR's group of the last scales keeps none
    per_position = 2 * 24 * 2 * 1536 * 2
    base, lazy = (r["kv_cache_bytes"] for r in records)
    assert base == per_position * (300 + 4 + 9 + 16 + 25)  # patch numbers 1, 2, 3, 4, 5 (6 is the last scale)
    assert lazy < base and lazy % per_position == 0
    assert "KV cache GB (real width)" in table.splitlines()[0]


def test_cli_prints_the_table_and_the_json(capsys):
    argv = "launches --models infinity-2b --methods baseline,fastvar:pruned_layers=null --depth 2 --size 256".split()
    assert cli_main(argv + ["--syncs", "--per-scale", "--block-ops"]) == 0
    out = capsys.readouterr().out
    assert "kernels per block): " in out
    assert "| infinity-2b (2 blocks, 7 scales) | bfloat16 | baseline |" in out
    assert "fastvar:pruned_layers=null" in out and "per scale" in out and "diffusers_var_accel/" in out
    assert cli_main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in report["records"]] == ["baseline", "fastvar:pruned_layers=null"]
    record = report["records"][0]
    assert record["kernels"] == sum(s["kernels"] for s in record["per_scale"]) + record["decode"]["kernels"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "gpt-2"], "--models 'gpt-2'"),
        (["--dtype", "int8"], "--dtype 'int8'"),
        (["--methods", "lazyvr"], "lazyvr"),
        (["--depth", "0"], "--depth"),
        (["--hart-scales", "40", "--models", "hart-0.7b"], "hart_scales"),
    ],
)
def test_bad_arguments_give_one_error_line(capsys, argv, message):
    assert (
        cli_main(["launches", *argv, "--size", "256", "--depth", "1"] if argv[0] != "--depth" else ["launches", *argv])
        == 2
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error") or "error:" in line]
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("model", ["infinity-2b", "hart-0.7b"])
def test_no_cfg_runs_fewer_ops_than_cfg(model):
    config = LaunchConfig(depth=1, size=256, hart_scales=4)
    with_cfg, without = (
        count_launches([model], ["baseline"], config=LaunchConfig(**{**config.__dict__, "cfg": cfg}))[0]
        for cfg in (True, False)
    )
    assert with_cfg["cfg"] and not without["cfg"]
    assert without["ops"] < with_cfg["ops"] and without["num_scales"] == with_cfg["num_scales"]


@pytest.mark.parametrize("dtype, budget", [(torch.bfloat16, 27), (torch.float32, 27)])
def test_a_dense_infinity_block_runs_the_fused_kernels(dtype, budget):
    """The block's fused form: the AdaLN modulation writes the Linear's input dtype, gated residuals are one addcmul,
    q/k normalisation and q's scale one factor, the RoPE sum carries the cast. A regression guard on the count (the
    per-op list says which op came back)."""
    pipe = build_launch_pipeline("infinity-2b", LaunchConfig(depth=2, size=256), dtype)
    result = count_generation(pipe, None, **_inputs(pipe))
    ops = result["dense_block_kernel_ops"]
    assert result["kernels_per_dense_block"] <= budget, ops
    assert ops.get("addcmul", 0) >= 4 and "add_" not in ops, ops  # two modulations and two gated residuals


@pytest.mark.parametrize("method, per_layer, per_scale", [("depthvar", 8, 12), ("arvar", 13, 10)])
def test_a_routed_layer_costs_a_bounded_number_of_kernels_over_the_dense_layer(method, per_layer, per_scale):
    """A regression guard on the routing overhead at the Infinity-2B schedule (1024², 4 DepthVAR dynamic scales, one
    ARVAR pruned scale with its attention source): the kernels a method adds over the baseline stay within a bound
    per routed (scale, layer) plus a few per routed scale (today 168 of 176 and 54 of 62 at depth 4). A per-layer
    sort, cast, repeat or recomputed per-call constant that comes back exceeds it."""
    config = LaunchConfig(depth=4)
    base, accelerated = count_launches(["infinity-2b"], ["baseline", method], config=config)
    routed_scales = 4 if method == "depthvar" else 1
    extra = accelerated["kernels"] - base["kernels"]
    assert 0 < extra <= (per_layer * config.depth + per_scale) * routed_scales, (extra, accelerated["kernel_ops"])
