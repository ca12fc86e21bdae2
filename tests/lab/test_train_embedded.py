"""``scripts/train_embedded.py``: its teacher-forcing targets are generation's quantisation, and a tiny end-to-end run
writes a pipeline folder that loads and generates (the real run takes about an hour; docs/embedded.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline
from script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_embedded.py"


@pytest.fixture(scope="module")
def train():
    return load_script(SCRIPT, "train_embedded", register=True)


@pytest.fixture(scope="module")
def vae_and_latents():
    torch.manual_seed(0)
    vae = InfinityBSQVAE(
        codebook_dim=8, base_ch=32, encoder_ch_mult=(1, 1), decoder_ch_mult=(1, 1, 1), num_res_blocks=1, patch_size=4
    ).eval()
    schedule = tuple((1, p, p) for p in (1, 2, 3, 4))
    with torch.no_grad():
        z = vae.encode(torch.rand(3, 3, 16, 16) * 2 - 1)
    return vae, z, schedule


def test_teacher_targets_are_the_multiscale_quantisation(train, vae_and_latents):
    vae, z, schedule = vae_and_latents
    with torch.no_grad():
        inputs, target = train.teacher_batch(vae, z, schedule)
        bits = vae.quantize_multiscale(z, schedule)
    expected = torch.cat([b.reshape(b.shape[0], -1, b.shape[-1]) for b in bits], dim=1).long()
    assert torch.equal(target, expected)
    assert inputs.shape == (3, sum(h * w for _, h, w in schedule[1:]), z.shape[1])


def test_teacher_batch_of_the_first_scales_is_the_full_batch_prefix(train, vae_and_latents):
    """``num_scales=K`` (the prefix pass) quantises K scales only; its inputs and targets are the full batch's first
    tokens, bit for bit."""
    vae, z, schedule = vae_and_latents
    lengths = [h * w for _, h, w in schedule]
    with torch.no_grad():
        inputs, target = train.teacher_batch(vae, z, schedule)
        for K in range(1, len(schedule) + 1):
            inputs_k, target_k = train.teacher_batch(vae, z, schedule, num_scales=K)
            n = sum(lengths[:K])
            assert target_k.shape[1] == n and inputs_k.shape[1] == n - lengths[0]
            assert torch.equal(target_k, target[:, :n]) and torch.equal(inputs_k, inputs[:, : n - lengths[0]])
        for bad in (0, len(schedule) + 1):
            with pytest.raises(ValueError, match=f"num_scales={bad}: expected 1..{len(schedule)}"):
                train.teacher_batch(vae, z, schedule, num_scales=bad)


def test_self_correction_replaces_bits_from_the_given_scale_and_requantises_the_rest(train, vae_and_latents):
    vae, z, schedule = vae_and_latents
    n = len(schedule)
    lengths = [h * w for _, h, w in schedule]
    with torch.no_grad():
        inputs, target = train.teacher_batch(vae, z, schedule)
        # its own true bits, or no scale replaced: the plain teacher batch
        same = train.teacher_batch(
            vae, z, schedule, replace_bits=target, replace_from=torch.zeros(3, dtype=torch.long)
        )
        none = train.teacher_batch(vae, z, schedule, replace_bits=1 - target, replace_from=torch.full((3,), n))
        # image 0 adds flipped bits from scale 2 on; images 1 and 2 are untouched
        start = torch.tensor([2, n, n])
        inputs_r, target_r = train.teacher_batch(vae, z, schedule, replace_bits=1 - target, replace_from=start)
    for a, b in ((same, (inputs, target)), (none, (inputs, target))):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(inputs_r[1:], inputs[1:]) and torch.equal(target_r[1:], target[1:])
    before = sum(lengths[:2])
    assert torch.equal(target_r[0, :before], target[0, :before])  # targets before the replaced scales are unchanged
    assert torch.equal(inputs_r[0, : lengths[1]], inputs[0, : lengths[1]])  # the input of scale 1 is the true prefix
    assert not torch.equal(
        inputs_r[0, before - lengths[0] :], inputs[0, before - lengths[0] :]
    )  # later inputs see the flips
    assert not torch.equal(
        target_r[0, before + lengths[2] :], target[0, before + lengths[2] :]
    )  # and are re-quantised


def test_world_options_map_the_scene_flags(train):
    args = train.parse_args(
        "--lattice 16 --object-sizes 0.375,0.375,0.375,0.375 --layout canonical --unnamed-color blue --background black --category-weights position=3,colors=0.5".split()
    )
    assert train.world_options(args) == {
        "lattice": 1 / 16,
        "sizes": ((0.375, 0.375), (0.375, 0.375)),
        "layout": "canonical",
        "unnamed_color": "blue",
        "background": "black",
        "category_weights": {"position": 3.0, "colors": 0.5},
        "grammar": "original",
    }
    assert train.world_options(train.parse_args([])) == {
        "lattice": None,
        "sizes": None,
        "layout": "random",
        "unnamed_color": None,
        "background": None,
        "category_weights": None,
        "grammar": "original",
    }
    assert train.world_options(train.parse_args(["--grammar", "enlarged"]))["grammar"] == "enlarged"
    _, tokenizer = train.build_text_encoder(16, 0, grammar="enlarged")
    assert tokenizer("four pink diamonds").input_ids[:3] != [2, 2, 2]  # known words, not <unk>
    with pytest.raises(SystemExit, match="object-sizes"):
        train.world_options(train.parse_args(["--object-sizes", "0.4,0.3,0.3,0.4"]))
    with pytest.raises(SystemExit, match="category-weights"):
        train.world_options(train.parse_args(["--category-weights", "position:3"]))
    with pytest.raises(SystemExit, match="eval-every 5 scores --eval-prompts"):  # not silently skipped
        train.main(["--eval-every", "5"])


def test_tiny_run_writes_a_pipeline_that_loads_and_generates(train, tmp_path, one_thread, capsys):
    output = tmp_path / "model"
    args = [
        "--output",
        str(output),
        *"--num-images 48 --vae-steps 2 --vae-base-ch 32 --vae-ch-mult 1,1,1 --steps 2 --depth 2 --embed-dim 32 --num-heads 2 --codebook-dim 8 --text-dim 16 --batch-size 4 --vae-batch-size 4 --self-correction 0.5 --decoder-steps 2 --log-every 1 --lattice 16 --eval-prompts 2 --eval-every 1 --eval-settings 2:0.5:0".split(),
    ]
    assert train.main(args) == 0
    log = capsys.readouterr().out
    assert "[eval step 1] 2:0.5:0  validation accuracy" in log  # the learning curve's point after step 1
    assert "[eval] 2:0.5:0  validation accuracy" in log  # and the final model's
    pipe = InfinityPipeline.from_pretrained(output)
    pipe.set_progress_bar_config(disable=True)
    assert [tuple(s) for s in pipe.transformer.config.scale_schedule] == [(1, p, p) for p in train.PATCH_NUMS]
    a = pipe("two red circles", generator=torch.Generator().manual_seed(0), output_type="pt").images
    b = pipe("two red circles", generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert a.shape == (1, 3, 64, 64) and torch.equal(a, b)

    # --reschedule: the same weights trained on another schedule of the same final map (the ninth round's recipe)
    finer = list(train.PATCH_NUMS[:-1]) + [train.PATCH_NUMS[-1] - 1, train.PATCH_NUMS[-1]]
    resumed = tmp_path / "rescheduled"
    common = ["--pipeline-path", str(output), "--resume", "--num-images", "48", "--steps", "1", "--batch-size", "4"]
    finer_arg = ["--patch-nums", ",".join(map(str, finer))]
    with pytest.raises(SystemExit, match="not .* \\(--patch-nums\\)"):  # a schedule change is never silent
        train.main(common + finer_arg + ["--output", str(resumed)])
    with pytest.raises(SystemExit, match="--reschedule keeps the final map"):
        train.main(common + ["--reschedule", "--patch-nums", "1,2,4,8", "--output", str(resumed)])
    with pytest.raises(SystemExit, match="give --resume"):
        train.main(["--reschedule", "--output", str(resumed)])
    assert train.main(common + ["--reschedule"] + finer_arg + ["--output", str(resumed)]) == 0
    rescheduled = InfinityPipeline.from_pretrained(resumed)
    assert [tuple(s) for s in rescheduled.transformer.config.scale_schedule] == [(1, p, p) for p in finer]
    rescheduled.set_progress_bar_config(disable=True)
    c = rescheduled("two red circles", generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert c.shape == (1, 3, 64, 64)


def test_scale_diagnosis_reads_the_models_left_right_symmetry(capsys):
    """``scripts/diagnose_embedded_scales.py`` on the packaged model: a row per category, a cell per scale; the true
    tokens of two-colour scenes differ between left and right at 2 x 2 (one-object scenes barely do; position scenes
    differ between top and bottom), and the
    packaged model's teacher-forced predictions there differ nearly as often (the fifth round's model, which drew
    both objects in one colour, 0.14 against 0.58 on 48 scenes: docs/embedded.md, sixth and seventh rounds)."""
    module = load_script("diagnose_embedded_scales")
    pipe = InfinityPipeline.from_pretrained("embedded")
    two = module.scale_report(pipe, "color_attr", 12)
    one = module.scale_report(pipe, "colors", 12)
    schedule = pipe.transformer.config.scale_schedule
    assert [s["hw"] for s in two["scales"]] == [list(s[1:]) for s in schedule]
    assert all(0 <= s["tokens_right"] <= 1 and 0.5 <= s["bit_confidence"] <= 1 for s in two["scales"])
    assert two["first_split_scale"]["hw"] == [2, 2]
    assert two["first_split_scale"]["true_left_right_differ"] > one["first_split_scale"]["true_left_right_differ"]
    split = two["first_split_scale"]
    assert split["predicted_left_right_differ"] >= 0.75 * split["true_left_right_differ"]
    assert split["predicted_left_right_differ"] > 2 * one["first_split_scale"]["predicted_left_right_differ"]
    # "above" / "below" scenes split top from bottom, where a centred single object does not
    stacked = module.scale_report(pipe, "position", 12)["first_split_scale"]
    assert stacked["true_top_bottom_differ"] > one["first_split_scale"]["true_top_bottom_differ"]
    assert module.main(["--scenes", "2", "--categories", "colors"]) == 0
    assert capsys.readouterr().out.count("| colors |") == 1
    with pytest.raises(SystemExit, match="--scenes 0"):
        module.main(["--scenes", "0"])


def test_prefix_loss_is_the_full_pass_loss_of_the_first_scales(train):
    """``--prefix-scales K``: the extra pass over the first K scales alone gives the loss the full block-causal pass
    gives those tokens (the same scenes, caption dropout and targets), so it trains exactly those predictions."""
    import types

    import numpy as np
    import torch.nn.functional as F

    from diffusers_var_accel.lab.data.shapes import make_dataset
    from diffusers_var_accel.next_scale.context import VARForwardContext
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily

    pipe = InfinityPipeline.from_pretrained("embedded")
    transformer, vae = pipe.transformer.eval(), pipe.vae.eval()
    schedule = tuple(tuple(s) for s in transformer.config.scale_schedule)
    family = InfinityScaleFamily(transformer, vae, schedule, schedule[-1][-2:], top_k=0, top_p=None)
    scenes = make_dataset(6, seed=1, size=64)
    images = torch.from_numpy(np.stack([np.asarray(i) for i, _, _ in scenes])).permute(0, 3, 1, 2).float() / 127.5 - 1
    captions = [c for _, c, _ in scenes]
    args = types.SimpleNamespace(device="cpu", prefix_scales=3, prefix_batch_size=6)
    prefix_len = 1 + 4 + 9  # the tokens of the first three scales
    with torch.no_grad():
        latents = vae.encode(images)
        loss = train.prefix_loss(
            args,
            transformer,
            pipe.text_encoder,
            pipe.tokenizer,
            family,
            vae,
            captions,
            latents,
            schedule,
            torch.Generator().manual_seed(0),
        )
        g = torch.Generator().manual_seed(0)  # the same draws: scenes, then dropout
        idx = torch.randint(0, 6, (6,), generator=g)
        drop = torch.rand(6, generator=g) < 0.1
        tokens = pipe.tokenizer([captions[i] for i in idx.tolist()], padding="longest", return_tensors="pt")
        text = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
        mask = tokens.attention_mask.bool()
        text = torch.where(drop.view(-1, 1, 1), transformer.null_text_embeds(mask).to(text.dtype), text)
        condition = transformer.encode_condition(text, mask)
        inputs, target = train.teacher_batch(vae, latents[idx], schedule)
        lengths = [h * w for _, h, w in schedule]
        scale_ids = torch.repeat_interleave(torch.arange(len(schedule)), torch.tensor(lengths))
        x = torch.cat((transformer.embed_start(condition), family.embed_inputs(inputs, scale_ids[1:])), dim=1)
        context = VARForwardContext(
            kv_cache=None, rope_cos_sin=family.rope_cos_sin(range(len(schedule))), token_scale_ids=scale_ids
        )
        logits = transformer.head_logits(transformer(x, condition, context), condition.cond_RC).float()
        full = F.cross_entropy(logits[:, 1:prefix_len].reshape(-1, 2), target[:, 1:prefix_len].reshape(-1))
    torch.testing.assert_close(loss, full, rtol=1e-5, atol=1e-6)
    with pytest.raises(SystemExit, match="--prefix-scales 1"):
        train.main(["--prefix-scales", "1"])


def test_late_scale_oracle_thins_the_last_scales_of_any_schedule(capsys):
    """``scripts/diagnose_late_scales.py``: with every code kept the scorer judges the tokenizer's own reconstruction;
    with the last scales' codes all dropped the image loses what those scales draw, so accuracy cannot rise above a
    schedule's all-codes accuracy by more than noise, and it falls when the dropped scales hold most of the latent
    (every scale after 2 x 2)."""
    module = load_script("diagnose_late_scales")
    import numpy as np

    from diffusers_var_accel.lab.data.shapes import make_dataset

    pipe = InfinityPipeline.from_pretrained("embedded")
    schedule = [tuple(s) for s in pipe.transformer.config.scale_schedule]
    from diagnose_embedded_scales import CAPTION_DECIDED_WORLD  # importable: the script put scripts/ on sys.path

    scenes = make_dataset(12, seed=3, size=64, category_weights={"color_attr": 1}, **CAPTION_DECIDED_WORLD)
    images = torch.from_numpy(np.stack([np.asarray(img.convert("RGB")) for img, _, _ in scenes]))
    images = images.permute(0, 3, 1, 2).float() / 127.5 - 1
    captions = [c for _, c, _ in scenes]
    coarse = len(schedule) - 2  # every scale after 2 x 2
    results = module.late_scale_accuracy(pipe.vae, schedule, images, captions, last=[1, coarse], keep=[1.0, 0.0])
    assert results[(1, 1.0)] == results[(coarse, 1.0)] == results[(0, 1.0)] >= 0.9  # all codes kept: no change
    assert results[(coarse, 0.0)] < 0.5 * results[(0, 1.0)]  # the coarse 2 x 2 sum alone draws no two-colour scene
    with pytest.raises(ValueError, match="--last 99"):
        module.late_scale_accuracy(pipe.vae, schedule, images[:1], captions[:1], last=[99], keep=[0.5])
    assert module.main(["--scenes", "1", "--last", "1", "--keep", "0.5", "--schedule", "1,2,4,8,16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("schedule 1,2,4,8,16: all codes ") and "last 1 thinned: keep 0.5: " in out
    with pytest.raises(SystemExit, match="final map"):
        module.main(["--scenes", "1", "--schedule", "1,2,4,8"])
