#!/usr/bin/env python
"""Where the embedded model's generations go wrong, scale by scale (docs/embedded.md, sixth round).

Teacher forcing on unseen scenes of the training world (the true prefix of every scale, one block-causal pass, no
guidance): per scale, the share of tokens whose 16 bits all come out right under argmax and the mean confidence of
their bits; then, at the first scale with more than one token in each row (2 x 2 on the embedded model's
schedule), whether the model makes the left and right halves differ where the true tokens do, and the top and bottom
halves ("above", "below"). A model that cannot tell left from right there draws both objects of "a red circle and a
green square" in one colour: every later scale follows that symmetric prefix.

    python scripts/diagnose_embedded_scales.py [--model embedded] [--scenes 48]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_embedded's teacher_batch

#: The training world of the packaged model's transformer stage (scripts/train_embedded.py, docs/embedded.md).
CAPTION_DECIDED_WORLD = dict(
    lattice=1 / 16,
    sizes=((0.375, 0.375), (0.375, 0.375)),
    layout="canonical",
    unnamed_color="blue",
    background="black",
)


def scale_report(pipe, category: str, num_scenes: int, seed: int = 999) -> dict:
    """Teacher-forced per-scale token accuracy and bit confidence on ``num_scenes`` scenes of ``category``, and the
    left/right and top/bottom agreement of the first scale whose rows hold two or more tokens."""
    import numpy as np
    import torch

    from diffusers_var_accel.lab.data.shapes import make_dataset
    from diffusers_var_accel.next_scale.context import VARForwardContext
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily

    from train_embedded import teacher_batch

    transformer, vae = pipe.transformer.eval(), pipe.vae.eval()
    schedule = tuple(tuple(int(v) for v in s) for s in transformer.config.scale_schedule)
    size = pipe.default_size
    family = InfinityScaleFamily(transformer, vae, schedule, schedule[-1][-2:], top_k=0, top_p=None)
    lengths = [h * w for _, h, w in schedule]
    scale_ids = torch.repeat_interleave(torch.arange(len(schedule)), torch.tensor(lengths))
    rope = family.rope_cos_sin(range(len(schedule)))
    scenes = make_dataset(num_scenes, seed=seed, size=size[0], category_weights={category: 1}, **CAPTION_DECIDED_WORLD)
    images = torch.from_numpy(np.stack([np.asarray(img.convert("RGB")) for img, _, _ in scenes]))
    images = images.permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        inputs, target = teacher_batch(vae, vae.encode(images), schedule)
        tokens = pipe.tokenizer([c for _, c, _ in scenes], padding="longest", return_tensors="pt")
        text = pipe.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
        condition = transformer.encode_condition(text, tokens.attention_mask.bool())
        x = torch.cat((transformer.embed_start(condition), family.embed_inputs(inputs, scale_ids[1:])), dim=1)
        context = VARForwardContext(kv_cache=None, rope_cos_sin=rope, token_scale_ids=scale_ids)
        logits = transformer.head_logits(transformer(x, condition, context), condition.cond_RC).float()
    pairs = logits.unflatten(-1, (-1, 2))
    predicted = pairs.argmax(-1)
    right = (predicted == target).all(-1).float()
    p_one = pairs.softmax(-1)[..., 1]
    confidence = torch.maximum(p_one, 1 - p_one).mean(-1)
    report = {"category": category, "scenes": num_scenes, "scales": []}
    offset = 0
    for (_, h, w), n in zip(schedule, lengths):
        part = slice(offset, offset + n)
        report["scales"].append(
            {
                "hw": [h, w],
                "tokens_right": right[:, part].mean().item(),
                "bit_confidence": confidence[:, part].mean().item(),
            }
        )
        offset += n
    first = next(i for i, (_, h, w) in enumerate(schedule) if w >= 2)
    _, h, w = schedule[first]
    part = slice(sum(lengths[:first]), sum(lengths[: first + 1]))
    pred = predicted[:, part].reshape(num_scenes, h, w, -1)
    true = target[:, part].reshape(num_scenes, h, w, -1)
    half_w, half_h = w // 2, h // 2  # the middle column (row) of an odd width (height) belongs to neither half

    def differ_left_right(t):  # a row's left half against its right half, mirrored
        return (t[:, :, :half_w] != t[:, :, w - half_w :].flip(2)).any(-1).float().mean().item()

    def differ_top_bottom(t):  # a column's top half against its bottom half, mirrored ("above" / "below")
        return (t[:, :half_h] != t[:, h - half_h :].flip(1)).any(-1).float().mean().item()

    report["first_split_scale"] = {
        "hw": [h, w],
        "true_left_right_differ": differ_left_right(true),
        "predicted_left_right_differ": differ_left_right(pred),
        "true_top_bottom_differ": differ_top_bottom(true),
        "predicted_top_bottom_differ": differ_top_bottom(pred),
    }
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded", help="a pipeline folder or 'embedded'")
    parser.add_argument("--scenes", type=int, default=48, help="scenes per category (default 48)")
    parser.add_argument("--categories", default="colors,color_attr,position")
    args = parser.parse_args(argv)
    if args.scenes < 1:
        raise SystemExit(f"--scenes {args.scenes}: expected at least 1")

    from diffusers_var_accel import InfinityPipeline

    pipe = InfinityPipeline.from_pretrained(args.model)
    for category in args.categories.split(","):
        report = scale_report(pipe, category.strip(), args.scenes)
        cells = " | ".join(f"{s['tokens_right']:.2f} / {s['bit_confidence']:.2f}" for s in report["scales"])
        split = report["first_split_scale"]
        print(
            f"| {report['category']} | {cells} | {split['true_left_right_differ']:.2f} | "
            f"{split['predicted_left_right_differ']:.2f} | {split['true_top_bottom_differ']:.2f} | "
            f"{split['predicted_top_bottom_differ']:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
