#!/usr/bin/env python
"""Train the embedded default model from scratch on the captioned-shapes world, on a CPU.

Everything is the real Infinity architecture at a tiny size, with the same classes the library runs:

1. **Data.** ``diffusers_var_accel.lab.data.shapes.make_dataset``: 64x64 images of 1-3 circles / squares / triangles with
   GenEval-style captions (single object, two objects, counting, colours, position, colour attribution).
2. **Tokenizer (BSQ VAE).** :class:`InfinityBSQVAE` with 16 bits per token and patch size 4 (64x64 pixels -> a 16x16
   latent; base 48 channels, multipliers 1, 1, 2), trained as an autoencoder through the multi-scale residual BSQ
   quantiser of generation (straight-through estimator), with an L1 + L2 reconstruction loss, an L1 loss on pixel
   differences (sharp edges) and a commitment term. It then reports the shapes scorer's accuracy on decoded
   ground-truth tokens of unseen scenes: the ceiling for the transformer.
3. **Text encoder.** A 2-layer T5 encoder (transformers) over a word-level tokenizer (tokenizers) of the world's
   vocabulary, trained jointly with the transformer.
4. **Transformer.** :class:`InfinityTransformer` (depth 6, width 128) with a fixed 10-scale schedule 1, 2, 3, 4, 5,
   6, 8, 10, 13, 16 (680 tokens; the last three scales hold 77 % of them, as in the real model), trained with
   teacher forcing on all scales in one pass (the block-causal mask of a grouped pass) and bitwise cross-entropy,
   each token weighted by (h*w)**-0.5 of its scale (Infinity's ``reweight_loss_by_scale``); 10 % of the captions are
   dropped to the learned unconditional embedding (for classifier-free guidance). Optional: Infinity's bitwise
   self-correction (``--bit-flip``).
5. **Save** an :class:`InfinityPipeline` folder (safetensors) that ``InfinityPipeline.from_pretrained`` loads offline.

Options (off by default; docs/embedded.md reports what they gave): ``--patch-nums`` (another schedule, e.g. an 8x8
final map with a patch-8 VAE), ``--decoder-steps`` (fine-tune the VAE decoder on the transformer's own sampled
tokens), ``--self-correction`` (feed the model its own samples from a random scale on, with re-quantised targets),
``--pipeline-path`` / ``--resume`` (start from a trained pipeline folder), ``--vae-only`` / ``--vae-path`` (train the
tokenizer alone / reuse one), the training world (``--lattice``, ``--object-sizes``, ``--layout``,
``--unnamed-color``, ``--background``, ``--category-weights``, ``--grammar``: see ``shapes.sample_scene`` and
``make_dataset``) and
``--eval-every`` (a validation learning curve).

Fixed seeds; every stage prints its losses. ``--device cuda`` runs the same recipe on a GPU in minutes, with other
rounding and so other weights. The packaged model is the output of these two commands, 16 + 40 minutes on 2
otherwise idle CPU cores (the first trains the tokenizer on random layouts, the second the transformer and the text
encoder on scenes that follow from their captions; docs/embedded.md says why):

    python scripts/train_embedded.py --vae-only --output /tmp/embedded-vae \
        --lattice 16 --object-sizes 0.25,0.3125,0.34,0.40 --vae-steps 1400
    python scripts/train_embedded.py --vae-path /tmp/embedded-vae/vae \
        --output diffusers_var_accel/embedded/shapes-infinity-tiny \
        --lattice 16 --object-sizes 0.375,0.375,0.375,0.375 --layout canonical --unnamed-color blue --background black \
        --steps 1700 --eval-prompts 120 --eval-every 400 --eval-settings 3:0.5:0,2:0.5:0,3:1:0

Those are the first two of six commands: four more continue the transformer (docs/embedded.md, sixth to ninth
rounds); the ninth (``--reschedule --patch-nums 1,2,3,4,5,6,8,10,12,13,14,15,16``) moves it to the packaged 13-scale
schedule, whose last four scales carry detail rather than layout (``scripts/diagnose_late_scales.py``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffusers_var_accel.lab.selection import decides  # noqa: E402

import numpy as np
import torch
import torch.nn.functional as F

#: The fixed schedule of the from-scratch stages: 10 scales to a 16x16 final map (VAR's ImageNet-256 schedule). The
#: packaged model was moved to 13 scales in its last stage (--reschedule, docs/embedded.md, ninth round).
PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--output", default="diffusers_var_accel/embedded/shapes-infinity-tiny", help="pipeline folder to write"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-images", type=int, default=20000, help="training scenes (rendered once)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument(
        "--lattice",
        type=int,
        default=0,
        help="N > 0: training scenes have object sizes and box corners on multiples of 1/N of the canvas "
        "(N = 16: one token of the 16x16 map), so edges fall on token boundaries; 0 = continuous",
    )
    p.add_argument(
        "--layout",
        choices=("random", "canonical"),
        default="random",
        help="training scenes: objects at random places on plain or two-tone backgrounds, or at fixed places "
        "that follow from the caption on plain ones (shapes.sample_scene)",
    )
    p.add_argument(
        "--object-sizes",
        default=None,
        help="'small_lo,small_hi,large_lo,large_hi': the training scenes' object size ranges, fractions of the "
        "canvas side (default: the world's, 0.19,0.27,0.30,0.40)",
    )
    p.add_argument(
        "--unnamed-color",
        default=None,
        help="training scenes: the colour of objects whose caption names none (default: random each)",
    )
    p.add_argument("--background", default=None, help="training scenes: one background for all (default: random)")
    p.add_argument(
        "--category-weights",
        default=None,
        help="training scenes: 'category=weight,...' relative weights of the caption categories (missing "
        "ones weigh 0; default: uniform)",
    )
    p.add_argument(
        "--grammar",
        choices=("original", "enlarged"),
        default="original",
        help="the captions' words (shapes.GRAMMARS): the original world of the held-out prompts, or the enlarged "
        "one (adds a diamond, pink, cyan and four, so that calibration prompts of every category exist outside the "
        "held-out set); the text tokenizer's vocabulary follows",
    )
    p.add_argument(
        "--patch-nums",
        default=",".join(map(str, PATCH_NUMS)),
        help="the fixed scale schedule (side of each square token map); the VAE's patch size is "
        "IMAGE_SIZE / the last one, so its channel multipliers need log2(patch) + 1 levels",
    )
    p.add_argument("--vae-steps", type=int, default=1500)
    p.add_argument("--vae-batch-size", type=int, default=16)
    p.add_argument("--vae-base-ch", type=int, default=48, help="VAE channels of the finest level (a multiple of 32)")
    p.add_argument("--vae-ch-mult", default="1,1,2", help="VAE channel multipliers per level (3 levels: patch 4)")
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--vae-res-blocks", type=int, default=1, help="VAE ResBlocks per encoder level (decoder: one more)")
    p.add_argument(
        "--vae-edge-weight",
        type=float,
        default=1.0,
        help="weight of an L1 loss on horizontal and vertical pixel differences (sharper edges)",
    )
    p.add_argument(
        "--vae-only",
        action="store_true",
        help="train and evaluate the VAE only (reconstruction PSNR and the "
        "shapes scorer's accuracy on decoded ground-truth tokens), save it to OUTPUT/vae, then stop",
    )
    p.add_argument(
        "--vae-path",
        default=None,
        help="use this trained VAE folder (e.g. OUTPUT/vae of a --vae-only run "
        "with the same seed and settings) instead of training one",
    )
    p.add_argument("--steps", type=int, default=1700, help="transformer steps")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--codebook-dim", type=int, default=16)
    p.add_argument("--text-dim", type=int, default=64)
    p.add_argument(
        "--bit-flip",
        type=float,
        default=0.0,
        help="bitwise self-correction (Infinity): flip each teacher bit with a probability drawn per image "
        "from [0, BIT_FLIP] and re-quantise the later scales' targets from the flipped sum",
    )
    p.add_argument(
        "--self-correction",
        type=float,
        default=0.0,
        help="probability that a training image is fed the model's own sampled bits from a random scale on "
        "(self-correction with the model's errors instead of random flips)",
    )
    p.add_argument(
        "--prefix-scales",
        type=int,
        default=0,
        help="K > 1: each step also runs the first K scales alone (a short sequence, cheap) on --prefix-batch-size "
        "more scenes, with the bit loss of scales 1..K-1 weighted by --prefix-weight: more training where the "
        "first multi-token scale must tell left from right (docs/embedded.md, sixth round); 0 = off",
    )
    p.add_argument("--prefix-batch-size", type=int, default=64)
    p.add_argument("--prefix-weight", type=float, default=1.0)
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --pipeline-path: continue training its transformer and text encoder for --steps steps",
    )
    p.add_argument(
        "--reschedule",
        action="store_true",
        help="with --resume: train the loaded transformer on --patch-nums although it was trained on another "
        "schedule of the same final map (the level embedding has a row per scale index and RoPE follows the "
        "schedule, so the weights carry over; the scales that moved are learned anew)",
    )
    p.add_argument(
        "--scale-loss-weight",
        type=float,
        default=0.5,
        help="weight every token of scale (h, w) by (h*w)**-ALPHA (normalised); 0.5 is Infinity's "
        "reweight_loss_by_scale, which gives the coarse scales, where the layout is decided, more weight",
    )
    p.add_argument(
        "--decoder-steps",
        type=int,
        default=0,
        help="after the transformer: fine-tune the VAE decoder on the transformer's own sampled tokens "
        "(see finetune_decoder); 0 = off",
    )
    p.add_argument("--decoder-lr", type=float, default=5e-4)
    p.add_argument(
        "--decoder-tokens",
        choices=("own", "truncated"),
        default="own",
        help="from a random scale on: the transformer's sampled bits ('own'), or nothing ('truncated': the "
        "decoder learns to draw from partial sums)",
    )
    p.add_argument(
        "--decoder-clean-fraction",
        type=float,
        default=0.25,
        help="fraction of decoder fine-tuning images decoded from their ground-truth tokens only",
    )
    p.add_argument(
        "--decoder-sampling",
        default="2.0:0.5",
        help="'guidance:tau' with which the transformer's tokens are sampled for decoder fine-tuning",
    )
    p.add_argument(
        "--pipeline-path",
        default=None,
        help="start from this trained pipeline folder (its VAE, transformer and text encoder, trained with "
        "the same data settings) and run only the decoder fine-tuning and evaluation",
    )
    p.add_argument("--device", default="cpu", help="torch device to train on (the defaults are sized for a CPU)")
    p.add_argument(
        "--eval-prompts",
        type=int,
        default=0,
        help="after saving, score N validation prompts (heldout_prompts(N, seed=1), not the held-out set)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also score the validation prompts (--eval-prompts, first --eval-settings) every N transformer "
        "steps: a learning curve (0 = off)",
    )
    p.add_argument(
        "--eval-settings",
        default="3.0:1.0:0",
        help="sampling settings to evaluate, 'guidance:tau:top_k' separated by commas",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument(
        "--time-limit-minutes",
        type=float,
        default=45.0,
        help="stop the transformer stage early after this long (0 = off)",
    )
    p.add_argument("--log-every", type=int, default=50)
    return p.parse_args(argv)


def build_text_encoder(text_dim: int, seed: int, max_length: int = 24, grammar: str = "original"):
    """A 2-layer T5 encoder and a word-level tokenizer over the vocabulary of the shapes world's ``grammar`` (unknown
    words -> <unk>)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    from diffusers_var_accel.lab.data.shapes import vocabulary

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in vocabulary(grammar):
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=max_length,
        padding_side="right",
    )
    config = T5Config(
        vocab_size=len(vocab),
        d_model=text_dim,
        d_kv=text_dim // 2,
        d_ff=2 * text_dim,
        num_layers=2,
        num_decoder_layers=0,
        num_heads=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return T5EncoderModel(config), tokenizer


def world_options(args) -> dict:
    """The ``make_dataset`` options of ``--lattice``, ``--object-sizes``, ``--layout``, ``--unnamed-color``,
    ``--background`` and ``--category-weights``."""
    sizes = None
    if args.object_sizes:
        v = [float(x) for x in args.object_sizes.split(",")]
        if len(v) != 4 or not (0 < v[0] <= v[1] and 0 < v[2] <= v[3] < 1):
            raise SystemExit(
                f"--object-sizes {args.object_sizes!r}: expected 'small_lo,small_hi,large_lo,large_hi', "
                "increasing pairs of fractions in (0, 1)"
            )
        sizes = ((v[0], v[1]), (v[2], v[3]))
    weights = None
    if args.category_weights:
        try:
            weights = {k.strip(): float(v) for k, v in (item.split("=") for item in args.category_weights.split(","))}
        except ValueError:
            raise SystemExit(f"--category-weights {args.category_weights!r}: expected 'category=weight,...'") from None
    return {
        "lattice": 1.0 / args.lattice if args.lattice else None,
        "sizes": sizes,
        "layout": args.layout,
        "unnamed_color": args.unnamed_color,
        "background": args.background,
        "category_weights": weights,
        "grammar": args.grammar,
    }


def render_dataset(n: int, seed: int, size: int, **world):
    from diffusers_var_accel.lab.data.shapes import make_dataset

    samples = make_dataset(n, seed=seed, size=size, **world)
    images = torch.from_numpy(np.stack([np.asarray(img.convert("RGB")) for img, _, _ in samples])).permute(0, 3, 1, 2)
    captions = [caption for _, caption, _ in samples]
    return images.float().div(127.5).sub(1.0), captions  # [-1, 1]


def multiscale_f_hat(vae, z, schedule):
    """The summed codes of the multi-scale quantisation of ``z`` (no gradient) and the bits of every scale."""
    bits = vae.quantize_multiscale(z, schedule)
    f_hat = None
    for si, b in enumerate(bits):
        f_hat = vae.add_scale_codes(f_hat, vae.bits_to_codes(b), schedule[-1], is_last_scale=si == len(bits) - 1)
    return f_hat, bits


def reconstruction_loss(recon: torch.Tensor, x: torch.Tensor, edge_weight: float) -> torch.Tensor:
    """L1 + L2, plus an L1 loss on horizontal and vertical pixel differences: the edges of flat shapes are what the
    scorer reads, and plain L1 / L2 blurs them."""
    loss = F.l1_loss(recon, x) + F.mse_loss(recon, x)
    if edge_weight:
        loss = loss + edge_weight * (
            F.l1_loss(recon.diff(dim=-1), x.diff(dim=-1)) + F.l1_loss(recon.diff(dim=-2), x.diff(dim=-2))
        )
    return loss


def cosine_step(opt, loss: torch.Tensor, base_lr: float, step: int, total: int) -> None:
    """One optimiser step, then the learning rate of the next one: a cosine decay from ``base_lr`` to 10 % of it."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    for group in opt.param_groups:
        group["lr"] = base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / total)))


def train_vae(args, images, schedule):
    from diffusers_var_accel import InfinityBSQVAE

    torch.manual_seed(args.seed + 1)
    ch_mult = tuple(int(v) for v in args.vae_ch_mult.split(","))
    vae = InfinityBSQVAE(
        codebook_dim=args.codebook_dim,
        base_ch=args.vae_base_ch,
        encoder_ch_mult=ch_mult,
        decoder_ch_mult=ch_mult,
        num_res_blocks=args.vae_res_blocks,
        patch_size=args.image_size // args.patch_nums[-1],
    ).to(args.device)
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed + 2)
    start = time.time()
    for step in range(1, args.vae_steps + 1):
        idx = torch.randint(0, images.shape[0], (args.vae_batch_size,), generator=g)
        x = images[idx].to(args.device)
        z = vae.encode(x)
        f_hat, _ = multiscale_f_hat(vae, z.detach(), schedule)
        z_q = (
            z + (f_hat - z).detach()
        )  # straight-through: the decoder sees the quantised sum, the encoder gets its gradient
        recon = vae.decoder(z_q)
        rec_loss = reconstruction_loss(recon, x, args.vae_edge_weight)
        commit = F.mse_loss(z, f_hat)
        loss = rec_loss + 0.25 * commit
        cosine_step(opt, loss, args.vae_lr, step, args.vae_steps)
        if step % args.log_every == 0 or step == 1:
            print(
                f"[vae] step {step:5d}/{args.vae_steps}  rec {rec_loss.item():.4f}  commit {commit.item():.4f}  "
                f"({time.time() - start:.0f} s)",
                flush=True,
            )
    return vae.eval()


def encode_dataset(vae, images, device, batch: int = 256) -> torch.Tensor:
    """Continuous latents ``z`` of every image (N, d, h, w), kept on the CPU; the bits are quantised per batch."""
    parts = []
    with torch.no_grad():
        for i in range(0, images.shape[0], batch):
            parts.append(vae.encode(images[i : i + batch].to(device)).float().cpu())
    return torch.cat(parts)


def teacher_batch(
    vae, z, schedule, flip_max: float = 0.0, generator=None, replace_bits=None, replace_from=None, num_scales=None
):
    """Teacher-forcing inputs (scales 1..) and target bits (all scales) of latents ``z`` (B, d, H, W).

    This is the multi-scale residual quantisation of generation (``quantize_multiscale``, ``add_scale_codes``,
    ``next_scale_input``). With ``flip_max > 0`` it is Infinity's bitwise self-correction: each image draws a flip
    probability from [0, flip_max], the bits added to ``f_hat`` are flipped with it, and every later scale's targets
    are the bits of the residual left by the flipped sum, so the model learns to correct its own earlier mistakes.
    With ``replace_bits`` (B, L, d) and ``replace_from`` (B,), image b adds ``replace_bits`` instead of its true bits
    at scales ``>= replace_from[b]`` (the model's own samples: self-correction with the errors it actually makes).
    With ``num_scales`` K, only the first K scales are quantised (each scale depends on the earlier ones only): the
    inputs of scales 1..K-1 and the targets of scales 0..K-1, equal to the first tokens of the full result.
    """
    B, d = z.shape[:2]
    final = schedule[-1]
    K = len(schedule) if num_scales is None else num_scales
    if not 1 <= K <= len(schedule):
        raise ValueError(f"num_scales={num_scales}: expected 1..{len(schedule)} (the schedule's scales)")
    p = torch.rand(B, generator=generator) * flip_max if flip_max > 0 else None
    f_hat, inputs, targets = None, [], []
    for si, (_, h, w) in enumerate(schedule[:K]):
        residual = (z if f_hat is None else z - f_hat).unsqueeze(2)
        if (h, w) != tuple(final[-2:]):
            residual = F.interpolate(residual, size=(1, h, w), mode="area")
        bits = residual.squeeze(2) > 0  # (B, d, h, w)
        targets.append(bits.permute(0, 2, 3, 1).reshape(B, h * w, d))
        if p is not None:
            flips = torch.rand(bits.shape, generator=generator) < p.view(B, 1, 1, 1)
            bits = bits ^ flips.to(bits.device)
        if replace_bits is not None:
            start = sum(hh * ww for _, hh, ww in schedule[:si])
            own = replace_bits[:, start : start + h * w].reshape(B, h, w, d).permute(0, 3, 1, 2)
            own = torch.empty_like(bits).copy_(
                own
            )  # the true bits' memory layout: the same kernels, the same rounding
            bits = torch.where((replace_from <= si).view(B, 1, 1, 1), own, bits)
        codes = vae.bits_to_codes(bits.permute(0, 2, 3, 1))
        f_hat = vae.add_scale_codes(f_hat, codes, final, is_last_scale=si == len(schedule) - 1)
        if si < K - 1:
            inputs.append(vae.next_scale_input(f_hat, schedule[si + 1][-2:]))
    empty = z.new_zeros(B, 0, d)  # K = 1: no scale has an input yet
    return (torch.cat(inputs, dim=1) if inputs else empty), torch.cat(targets, dim=1).long()


def train_transformer(args, vae, captions, latents, schedule, resume=None):
    """Train the transformer and the text encoder (from scratch, or from ``resume=(transformer, text_encoder,
    tokenizer)``). With ``--self-correction P``, an image of the batch is, with probability P, fed its own sampled
    bits from a random scale on (a no-grad teacher-forced pass first), with the targets re-quantised from that sum."""
    from diffusers_var_accel import InfinityPipeline, InfinityTransformer
    from diffusers_var_accel.next_scale.context import VARForwardContext
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily

    device = args.device
    if resume is not None:
        transformer, text_encoder, tokenizer = resume
        transformer.requires_grad_(True)
        text_encoder.requires_grad_(True)
    else:
        text_encoder, tokenizer = build_text_encoder(args.text_dim, args.seed + 3, grammar=args.grammar)
        torch.manual_seed(args.seed + 4)
        transformer = InfinityTransformer(
            depth=args.depth,
            embed_dim=args.embed_dim,
            num_heads=args.num_heads,
            mlp_ratio=4.0,
            text_channels=args.text_dim,
            text_maxlen=tokenizer.model_max_length,
            codebook_dim=args.codebook_dim,
            block_chunks=1,
            scale_schedule=schedule,
        )
        with torch.no_grad():  # the official initialisation scale of the learned unconditional text and start token
            transformer.cfg_uncond.normal_(0, 0.02)
            transformer.pos_start.normal_(0, math.sqrt(1 / args.embed_dim / 3))
            transformer.head.weight.mul_(0.1)
    transformer.to(device)
    text_encoder.to(device)
    family = InfinityScaleFamily(transformer, vae, schedule, schedule[-1][-2:], top_k=0, top_p=None)
    lengths = [h * w for _, h, w in schedule]
    scale_ids = torch.repeat_interleave(torch.arange(len(schedule)), torch.tensor(lengths)).to(device)
    rope = family.rope_cos_sin(range(len(schedule)))
    token_weight = torch.cat([torch.full((n,), float(n) ** -args.scale_loss_weight) for n in lengths])
    token_weight = (token_weight / token_weight.sum()).to(device)  # (L,): the loss is a weighted mean over tokens
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.97), weight_decay=0.02)
    warmup = max(1, args.steps // 30)
    g = torch.Generator().manual_seed(args.seed + 5)
    start = time.time()
    N = len(captions)
    transformer.train()
    text_encoder.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, N, (args.batch_size,), generator=g)
        drop = torch.rand(args.batch_size, generator=g) < 0.1
        tokens = tokenizer([captions[i] for i in idx.tolist()], padding="longest", return_tensors="pt").to(device)
        text = text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
        mask = tokens.attention_mask.bool()
        null = transformer.null_text_embeds(mask).to(text.dtype)
        text = torch.where(drop.to(device).view(-1, 1, 1), null, text)
        condition = transformer.encode_condition(text, mask)
        context = VARForwardContext(kv_cache=None, rope_cos_sin=rope, token_scale_ids=scale_ids)
        with torch.no_grad():
            z = latents[idx].to(device)
            own, first_own = None, None
            if args.self_correction > 0:  # the model's own samples (conditional logits, tau 1) given the true prefix
                inputs, _ = teacher_batch(vae, z, schedule)
                x = torch.cat((transformer.embed_start(condition), family.embed_inputs(inputs, scale_ids[1:])), dim=1)
                own_logits = transformer.head_logits(transformer(x, condition, context), condition.cond_RC).float()
                p_one = own_logits.unflatten(-1, (-1, 2)).softmax(-1)[..., 1]
                own = torch.rand(p_one.shape, generator=g).to(device) < p_one
                first_own = torch.randint(1, len(schedule), (args.batch_size,), generator=g).to(device)
                first_own[torch.rand(args.batch_size, generator=g).to(device) >= args.self_correction] = len(schedule)
            inputs, target = teacher_batch(vae, z, schedule, args.bit_flip, g, own, first_own)
        x = torch.cat((transformer.embed_start(condition), family.embed_inputs(inputs, scale_ids[1:])), dim=1)
        hidden = transformer(x, condition, context)
        logits = transformer.head_logits(hidden, condition.cond_RC).float()  # (B, L, 2d)
        bit_loss = F.cross_entropy(logits.reshape(-1, 2), target.reshape(-1), reduction="none").view(target.shape)
        loss = (bit_loss.mean(dim=(0, 2)) * token_weight).sum()
        if args.prefix_scales:  # the first scales alone: block-causal, so the same as the full pass's first tokens
            loss = loss + args.prefix_weight * prefix_loss(
                args, transformer, text_encoder, tokenizer, family, vae, captions, latents, schedule, g
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 2.0)
        opt.step()
        lr = args.lr * min(1.0, step / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        if step % args.log_every == 0 or step == 1:
            with torch.no_grad():
                acc = (logits.reshape(-1, 2).argmax(-1) == target.reshape(-1)).float().mean().item()
                last = (
                    (logits[:, -lengths[-1] :].reshape(-1, 2).argmax(-1) == target[:, -lengths[-1] :].reshape(-1))
                    .float()
                    .mean()
                    .item()
                )
            print(
                f"[transformer] step {step:5d}/{args.steps}  loss {loss.item():.4f}  bit acc {acc:.3f} (last scale {last:.3f})  "
                f"lr {lr:.2e}  ({time.time() - start:.0f} s)",
                flush=True,
            )
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            t_eval = time.time()  # the learning curve's evaluations do not count against the time limit
            pipe = InfinityPipeline(
                transformer=transformer.eval(), vae=vae, text_encoder=text_encoder.eval(), tokenizer=tokenizer
            )
            evaluate_validation(pipe, args.eval_prompts, args.eval_settings.split(",")[0], label=f"eval step {step}")
            transformer.train()
            text_encoder.train()
            start += time.time() - t_eval
        if args.time_limit_minutes and time.time() - start > 60 * args.time_limit_minutes:
            print(f"[transformer] time limit reached at step {step}", flush=True)
            break
    return transformer.eval(), text_encoder.eval(), tokenizer


def prefix_loss(args, transformer, text_encoder, tokenizer, family, vae, captions, latents, schedule, g):
    """Bit cross-entropy of scales 1..K-1 (``--prefix-scales K``) on ``--prefix-batch-size`` scenes, from a pass over
    their tokens of the first K scales only (the block-causal mask makes it the full pass's prefix), with the same
    caption dropout."""
    from diffusers_var_accel.next_scale.context import VARForwardContext

    device, K = args.device, args.prefix_scales
    lengths = [h * w for _, h, w in schedule[:K]]
    idx = torch.randint(0, len(captions), (args.prefix_batch_size,), generator=g)
    drop = torch.rand(args.prefix_batch_size, generator=g) < 0.1
    tokens = tokenizer([captions[i] for i in idx.tolist()], padding="longest", return_tensors="pt").to(device)
    text = text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
    mask = tokens.attention_mask.bool()
    text = torch.where(drop.to(device).view(-1, 1, 1), transformer.null_text_embeds(mask).to(text.dtype), text)
    condition = transformer.encode_condition(text, mask)
    with torch.no_grad():  # only the first K scales are quantised
        inputs, target = teacher_batch(vae, latents[idx].to(device), schedule, num_scales=K)
    scale_ids = torch.repeat_interleave(torch.arange(K), torch.tensor(lengths)).to(device)
    rope = family.rope_cos_sin(range(K))
    x = torch.cat((transformer.embed_start(condition), family.embed_inputs(inputs, scale_ids[1:])), dim=1)
    context = VARForwardContext(kv_cache=None, rope_cos_sin=rope, token_scale_ids=scale_ids)
    logits = transformer.head_logits(transformer(x, condition, context), condition.cond_RC).float()[:, 1:]
    target = target[:, 1:]
    return F.cross_entropy(logits.reshape(-1, 2), target.reshape(-1))


def summed_codes(vae, bits_BLd: torch.Tensor, schedule, keep=None) -> torch.Tensor:
    """``f_hat`` of per-scale bits concatenated over the schedule; with ``keep`` (B, L, 1), dropped tokens add no code."""
    B, f_hat, offset = bits_BLd.shape[0], None, 0
    for si, (_, h, w) in enumerate(schedule):
        codes = vae.bits_to_codes(bits_BLd[:, offset : offset + h * w].reshape(B, h, w, -1))
        if keep is not None:
            codes = codes * keep[:, offset : offset + h * w].reshape(B, 1, h, w).to(
                codes.dtype
            )  # codes are (B, d, h, w)
        f_hat = vae.add_scale_codes(f_hat, codes, schedule[-1], is_last_scale=si == len(schedule) - 1)
        offset += h * w
    return f_hat


def own_samples(
    transformer,
    text_encoder,
    tokenizer,
    family,
    captions,
    inputs,
    scale_ids,
    rope,
    guidance: float,
    tau: float,
    generator,
) -> torch.Tensor:
    """Bits (B, L, d) sampled from the transformer's teacher-forced logits (one block-causal pass over the true
    prefix of every scale), with classifier-free guidance and temperature as in generation."""
    from diffusers_var_accel.next_scale.context import VARForwardContext

    B, device = inputs.shape[0], inputs.device
    tokens = tokenizer(captions, padding="longest", return_tensors="pt").to(device)
    text = text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
    mask = tokens.attention_mask.bool()
    text = torch.cat((text, transformer.null_text_embeds(mask).to(text.dtype)))
    condition = transformer.encode_condition(text, torch.cat((mask, mask)))
    x = torch.cat(
        (transformer.embed_start(condition), family.embed_inputs(inputs.repeat(2, 1, 1), scale_ids[1:])), dim=1
    )
    context = VARForwardContext(kv_cache=None, rope_cos_sin=rope, token_scale_ids=scale_ids)
    logits = transformer.head_logits(transformer(x, condition, context), condition.cond_RC).float() / tau
    logits = (guidance * logits[:B] + (1 - guidance) * logits[B:]).unflatten(-1, (-1, 2))  # (B, L, d, 2)
    p_one = logits.softmax(-1)[..., 1]
    return torch.rand(p_one.shape, generator=generator).to(device) < p_one


def finetune_decoder(args, vae, transformer, text_encoder, tokenizer, captions, images, latents, schedule):
    """Fine-tune the VAE decoder on the tokens the transformer actually samples (encoder and codebook frozen).

    The decoder was trained on the summed codes of ground-truth tokens only; generated tokens differ from them at
    the fine scales, mostly on object edges, and it decodes such sums to blurred, merged blobs. Here each training
    image gets a random scale k: its scales before k keep their ground-truth bits, scales k.. take bits sampled from
    the transformer's teacher-forced logits (one block-causal pass, classifier-free guidance and temperature as in
    generation), and the decoder learns to reconstruct the clean image from their sum. A fraction of the images keep
    all ground-truth bits, so decoding real tokens stays as good. The tokens, and so the transformer, are unchanged.
    With ``--decoder-tokens truncated`` the scales from k on add nothing instead (k from the middle of the schedule):
    the decoder learns to draw from partial sums, and no transformer pass is needed.
    """
    from diffusers_var_accel.pipelines.infinity.pipeline_infinity import InfinityScaleFamily

    device = args.device
    guidance, tau = (float(v) for v in args.decoder_sampling.split(":"))
    family = InfinityScaleFamily(transformer, vae, schedule, schedule[-1][-2:], top_k=0, top_p=None)
    lengths = [h * w for _, h, w in schedule]
    scale_ids = torch.repeat_interleave(torch.arange(len(schedule)), torch.tensor(lengths)).to(device)
    rope = family.rope_cos_sin(range(len(schedule)))
    for module in (transformer, text_encoder):
        module.eval().requires_grad_(False)
    vae.eval().requires_grad_(False)
    vae.decoder.train().requires_grad_(True)
    params = list(vae.decoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.decoder_lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed + 6)
    start = time.time()
    for step in range(1, args.decoder_steps + 1):
        idx = torch.randint(0, len(captions), (args.batch_size,), generator=g)
        B = args.batch_size
        with torch.no_grad():
            inputs, target = teacher_batch(vae, latents[idx].to(device), schedule)
            lowest = (
                len(schedule) // 2 if args.decoder_tokens == "truncated" else 0
            )  # a sum of 1-4 scales draws little
            first_sampled = torch.randint(lowest, len(schedule), (B,), generator=g).to(device)
            first_sampled[torch.rand(B, generator=g).to(device) < args.decoder_clean_fraction] = len(schedule)
            use_sampled = (scale_ids[None, :] >= first_sampled[:, None]).unsqueeze(-1)  # (B, L, 1)
            if args.decoder_tokens == "truncated":  # the sum stops before scale k: no transformer pass needed
                f_hat = summed_codes(vae, target.bool(), schedule, keep=~use_sampled)
            else:
                sampled = own_samples(
                    transformer,
                    text_encoder,
                    tokenizer,
                    family,
                    [captions[i] for i in idx.tolist()],
                    inputs,
                    scale_ids,
                    rope,
                    guidance,
                    tau,
                    g,
                )
                f_hat = summed_codes(vae, torch.where(use_sampled, sampled, target.bool()), schedule)
        x_img = images[idx].to(device)
        loss = reconstruction_loss(vae.decoder(f_hat), x_img, args.vae_edge_weight)
        cosine_step(opt, loss, args.decoder_lr, step, args.decoder_steps)
        if step % args.log_every == 0 or step == 1:
            print(
                f"[decoder] step {step:5d}/{args.decoder_steps}  rec {loss.item():.4f}  ({time.time() - start:.0f} s)",
                flush=True,
            )
    vae.decoder.eval().requires_grad_(False)
    return vae


@decides("training's validation")
def evaluate_validation(folder, n: int, settings: str, label: str = "eval") -> None:
    """Scorer accuracy on ``heldout_prompts(n, seed=1)`` (validation, disjoint draws from the held-out set) for each
    'guidance:tau:top_k' setting: how the embedded model's sampling settings are chosen. ``folder`` is a pipeline
    folder or a pipeline."""
    from diffusers_var_accel import InfinityPipeline
    from diffusers_var_accel.lab.data.shapes import heldout_prompts
    from diffusers_var_accel.lab.evaluation import evaluate_shapes

    pipe = InfinityPipeline.from_pretrained(folder) if isinstance(folder, (str, Path)) else folder
    prompts = heldout_prompts(n, seed=1)
    for setting in settings.split(","):
        guidance, tau, top_k = setting.split(":")
        sampling = dict(guidance_scale=float(guidance), tau=float(tau), top_k=int(top_k), top_p=None)
        report = evaluate_shapes(pipe, prompts=prompts, sampling=sampling, batch_size=20, progress=False)
        print(
            f"[{label}] {setting}  validation accuracy {report['overall']:.3f}  "
            f"{ {k: round(v, 2) for k, v in report['per_category'].items()} }",
            flush=True,
        )


def report_tokenizer(vae, images, args, schedule, t0: float, label: str = "vae") -> None:
    """Reconstruction PSNR through the quantiser, and the scorer's accuracy on decoded ground-truth tokens of 240
    unseen scenes: the ceiling of the model, the best a perfect transformer could reach with this tokenizer."""
    from diffusers_var_accel.lab.data.scorer import score_batch
    from diffusers_var_accel.lab.data.shapes import make_dataset

    with torch.no_grad():
        f_hat, _ = multiscale_f_hat(vae, vae.encode(images[:256].to(args.device)), schedule)
        psnr = -10 * torch.log10(F.mse_loss((vae.decode(f_hat).cpu() + 1) / 2, (images[:256] + 1) / 2)).item()
    print(f"[{label}] reconstruction PSNR through the multi-scale quantiser: {psnr:.2f} dB", flush=True)
    world = {**world_options(args), "category_weights": None}  # the ceiling over uniform categories, as in evaluation
    held = make_dataset(240, seed=args.seed + 1000, size=args.image_size, **world)
    x = (
        torch.from_numpy(np.stack([np.asarray(img.convert("RGB")) for img, _, _ in held])).permute(0, 3, 1, 2).float()
        / 127.5
        - 1
    )
    with torch.no_grad():
        f_hat, _ = multiscale_f_hat(vae, vae.encode(x.to(args.device)), schedule)
        decoded = ((vae.decode(f_hat).cpu() + 1) / 2).permute(0, 2, 3, 1).numpy()
    report = score_batch([caption for _, caption, _ in held], list(decoded), grammar=args.grammar)
    print(
        f"[{label}] scorer accuracy on decoded ground-truth tokens (240 unseen scenes): {report['overall']:.3f} "
        f"{ {k: round(v, 2) for k, v in report['per_category'].items()} }  ({(time.time() - t0) / 60:.1f} min)",
        flush=True,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    args.patch_nums = tuple(int(v) for v in args.patch_nums.split(","))
    if args.resume and not args.pipeline_path:
        raise SystemExit("--resume continues the transformer of --pipeline-path FOLDER; give that folder")
    if args.reschedule and not args.resume:
        raise SystemExit("--reschedule changes the schedule of the transformer that --resume continues; give --resume")
    if args.eval_every and not args.eval_prompts:
        raise SystemExit(f"--eval-every {args.eval_every} scores --eval-prompts N validation prompts; give N > 0")
    if args.decoder_tokens != "own" and not args.decoder_steps:
        raise SystemExit(
            f"--decoder-tokens {args.decoder_tokens} needs --decoder-steps N > 0 (the decoder stage is off)"
        )
    if args.prefix_scales and not 1 < args.prefix_scales <= len(args.patch_nums):
        raise SystemExit(f"--prefix-scales {args.prefix_scales}: expected 0 (off) or 2..{len(args.patch_nums)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    schedule = tuple((1, p, p) for p in args.patch_nums)
    t0 = time.time()
    if args.lattice < 0:
        raise SystemExit(f"--lattice {args.lattice}: expected 0 (off) or a positive number of cells per side")
    images, captions = render_dataset(args.num_images, args.seed, args.image_size, **world_options(args))
    print(
        f"[data] {len(captions)} scenes of {args.image_size}x{args.image_size} ({time.time() - t0:.0f} s); e.g. {captions[:3]}",
        flush=True,
    )
    from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline

    pipe = None
    if args.pipeline_path:
        pipe = InfinityPipeline.from_pretrained(args.pipeline_path).to(args.device)
        vae = pipe.vae.eval()
        loaded = [list(s) for s in pipe.transformer.config.scale_schedule]
        if args.reschedule and loaded != [list(s) for s in schedule]:
            if loaded[-1] != list(schedule[-1]):
                raise SystemExit(
                    f"--reschedule keeps the final map: {args.pipeline_path} ends at {loaded[-1]}, --patch-nums at "
                    f"{list(schedule[-1])}"
                )
            if len(schedule) > pipe.transformer.config.num_levels:
                raise SystemExit(
                    f"--patch-nums has {len(schedule)} scales; the transformer's level embedding has "
                    f"{pipe.transformer.config.num_levels} rows"
                )
            pipe.transformer.register_to_config(scale_schedule=[list(s) for s in schedule])
            print(f"[pipeline] rescheduled {loaded} -> {[list(s) for s in schedule]}", flush=True)
        elif loaded != [list(s) for s in schedule]:
            raise SystemExit(
                f"--pipeline-path {args.pipeline_path} has the schedule {pipe.transformer.config.scale_schedule}, "
                f"not {schedule} (--patch-nums)"
            )
        print(f"[pipeline] loaded {args.pipeline_path}", flush=True)
    elif args.vae_path:
        vae = InfinityBSQVAE.from_pretrained(args.vae_path).to(args.device).eval()
        print(f"[vae] loaded {args.vae_path}", flush=True)
    else:
        vae = train_vae(args, images, schedule)
    for p in vae.parameters():
        p.requires_grad_(False)
    latents = encode_dataset(vae, images, args.device)
    report_tokenizer(vae, images, args, schedule, t0)
    if args.vae_only:
        vae.to("cpu").save_pretrained(Path(args.output) / "vae", safe_serialization=True)
        return 0
    if pipe is None or args.resume:
        resume = (pipe.transformer, pipe.text_encoder, pipe.tokenizer) if pipe is not None else None
        transformer, text_encoder, tokenizer = train_transformer(args, vae, captions, latents, schedule, resume)
        pipe = InfinityPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)
    if args.decoder_steps:
        finetune_decoder(
            args, vae, pipe.transformer, pipe.text_encoder, pipe.tokenizer, captions, images, latents, schedule
        )
        report_tokenizer(vae, images, args, schedule, t0, label="decoder")
    pipe.to("cpu").save_pretrained(args.output, safe_serialization=True)
    size_mb = sum(f.stat().st_size for f in Path(args.output).rglob("*") if f.is_file()) / 2**20
    print(f"wrote {args.output} ({size_mb:.1f} MB) in {(time.time() - t0) / 60:.1f} min", flush=True)
    if args.eval_prompts:
        evaluate_validation(args.output, args.eval_prompts, args.eval_settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
