"""Shared helpers of the tests driven by the official golden fixtures (tests/fixtures/*)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file


def load_fixture(folder: Path, what: str, env_var: str):
    """A golden fixture folder's ``(manifest, inputs, reference)``; a missing or incomplete folder fails loudly,
    naming ``what`` it should hold and the variable ``env_var`` that points the tests at another one."""
    if not (folder / "manifest.json").is_file():
        pytest.fail(f"{what} fixture folder missing or incomplete: {folder} (set {env_var})")
    manifest = json.loads((folder / "manifest.json").read_text())
    return manifest, load_file(folder / "inputs.safetensors"), load_file(folder / "reference.safetensors")


class HARTFixture:
    """A golden fixture folder of the HART layout (``hart-tiny/`` in the released format, ``inputs.safetensors``,
    ``manifest.json`` with its ``runs``, ``ref_<run>.safetensors``): ``env_var`` points the tests at another folder
    of the layout; a missing or incomplete folder fails loudly, naming ``what`` it should hold."""

    def __init__(self, env_var: str, default: Path, what: str):
        self.folder, self.env_var, self.what = Path(os.environ.get(env_var, default)), env_var, what
        path = self.folder / "manifest.json"
        self.manifest = json.loads(path.read_text()) if path.is_file() else None
        self.runs = sorted(self.manifest["runs"]) if self.manifest is not None else ["<fixture missing>"]

    def require(self) -> None:
        if self.manifest is None:
            pytest.fail(f"{self.what} fixture folder missing or incomplete: {self.folder} (set {self.env_var})")

    def pipeline(self):
        """The fixture's ``hart-tiny`` as a ``HARTPipeline`` (its EMA weights), progress bars off."""
        from diffusers_var_accel.pipelines.hart.convert import load_original_hart_pipeline

        self.require()
        pipeline = load_original_hart_pipeline(self.folder / "hart-tiny")
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def inputs(self):
        self.require()
        return load_file(self.folder / "inputs.safetensors")


def padded_text(inputs, name: str = "text"):
    """A fixture's varlen T5 features (``<name>.kv_compact``, ``.lens``, ``.cu_seqlens_k``) as padded embeds + mask."""
    kv, lens, cu = (
        inputs[f"{name}.kv_compact"],
        inputs[f"{name}.lens"].tolist(),
        inputs[f"{name}.cu_seqlens_k"].tolist(),
    )
    embeds = torch.zeros(len(lens), max(lens), kv.shape[1])
    mask = torch.zeros(len(lens), max(lens), dtype=torch.bool)
    for b, n in enumerate(lens):
        embeds[b, :n] = kv[cu[b] : cu[b + 1]]
        mask[b, :n] = True
    return embeds, mask


def official_call_kwargs(manifest, call, embeds, mask):
    """``InfinityPipeline`` arguments that replay one official ``autoregressive_infer_cfg`` call of a manifest."""
    num_scales = len(manifest["scale_schedule"])
    height, width = manifest["image_hw"]
    return dict(
        prompt_embeds=embeds,
        prompt_attention_mask=mask,
        height=height,
        width=width,
        cfg_list=call["cfg_list"][:num_scales],
        tau_list=call["tau_list"][:num_scales],
        top_k=call["top_k"],
        top_p=call["top_p"] if call["top_p"] > 0 else None,  # the official code treats 0 as "off"
        generator=torch.Generator("cpu").manual_seed(call["g_seed"]),
    )


class RecordingFastVAR:
    """Builds a FastVAR scheduler whose routers record the call's decisions in ``self.log`` (tests only):
    ``log["kept"][(scale, layer, sublayer)]`` the kept indices, ``log["scores"]`` the PTS scores of that sublayer's
    input, ``log["updates"]`` the cache scale's recorded sublayer updates (the CTR cache)."""

    @staticmethod
    def build(**config):
        from diffusers_var_accel import FastVARScheduler
        from diffusers_var_accel.schedulers.scheduling_fastvar import pivotal_token_scores

        class _LoggingSelector:
            def __init__(self, selector, key, log):
                self.selector, self.key, self.log = selector, key, log

            def __call__(self, x_RLC):
                index = self.selector(x_RLC)
                self.log["kept"][self.key] = index.clone()
                self.log["scores"][self.key] = pivotal_token_scores(x_RLC)
                return index

        class _Recording(FastVARScheduler):
            def route_pass(self, state, plan):
                routes = super().route_pass(state, plan)
                if routes is not None:
                    k = plan.scale_indices[0]
                    routes.routes = {
                        key: replace(route, selector=_LoggingSelector(route.selector, (k, *key), self.log))
                        for key, route in routes.routes.items()
                    }
                return routes

            def after_scale(self, state, plan, hidden_states_RLC):
                super().after_scale(state, plan, hidden_states_RLC)
                for (layer, sublayer), update in state.records.sublayer_updates.items():
                    self.log["updates"][(plan.scale_indices[0], layer, sublayer)] = update.clone()

        scheduler = _Recording(**config)
        scheduler.log = {"kept": {}, "scores": {}, "updates": {}}
        return scheduler


def assert_official_uint8(ours_uint8_bgr: torch.Tensor, reference: torch.Tensor) -> None:
    """Our image as the official uint8 BGR image (truncated, channels flipped) equals the reference up to rounding:
    no value off by more than 1, under 1 % of the values off at all (FIXTURE.md)."""
    diff = (ours_uint8_bgr.int() - reference.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


def check_pipeline_uint8_image(pipe, manifest, inputs, ref, run: str = "greedy_cfg") -> bool:
    """The user-facing image (``output_type="np"``) of a run's exact call against the official uint8 image of sample 0.

    Returns False when the fixture stores no uint8 image for ``run``."""
    if f"{run}.img_uint8_bgr_s0" not in ref:
        return False
    embeds, mask = padded_text(inputs)
    # the run's exact call (its lists may be longer than the schedule: official_call_kwargs takes one per scale)
    images = pipe(
        **official_call_kwargs(manifest, manifest["runs"][run]["call"], embeds, mask), output_type="np"
    ).images
    assert images.shape[1:3] == tuple(manifest["image_hw"])
    ours = torch.from_numpy(images[:1] * 255).to(torch.uint8).flip(dims=(3,))  # truncation + BGR, as the official
    assert_official_uint8(ours, ref[f"{run}.img_uint8_bgr_s0"])
    return True


def replay_hart_run(pipe, inputs, meta, greedy=None, **extra):
    """One official HART ``autoregressive_infer_cfg`` call of a fixture manifest through ``HARTPipeline``.

    ``greedy`` forces top_k=1 (the fixtures' patched sampler); ``None`` reads the run's ``greedy_top_k1`` (non-greedy
    runs keep the official 600/300). Returns ``(image, recorded)`` with the raw logits, tokens and f_hat per scale.
    """
    call = meta["call"]
    greedy = meta["greedy_top_k1"] if greedy is None else greedy
    recorded = {}

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: v.clone() for k, v in kwargs.items() if v is not None}
        return {}

    image = pipe(
        prompt_embeds=inputs["context_tensor"],
        prompt_position_ids=inputs["context_position_ids"],
        guidance_scale=call["cfg"],
        top_k=1 if greedy else None,
        top_p=call["top_p"],
        more_smooth=call["more_smooth"],
        use_diffusion_head=call["final_stage"] == 0,
        generator=torch.Generator().manual_seed(call["g_seed"]),
        diffusion_generator=torch.Generator().manual_seed(meta["torch_manual_seed_before_call"]),
        output_type="pt",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["latents", "tokens", "logits"],
        **extra,
    ).images
    return image, recorded


def check_hart_tokens_and_logits(recorded, ref, meta, batch_size: int, logits_key: str = "logits_guided") -> None:
    """The tokens of every scale of a replayed HART run equal the reference's, and the logits they were sampled from
    (guided with the run's ``t`` per scale, or the rows' own when only one set of rows ran) match its top two, and
    the full logits where it records them (``<logits_key>_top2_values_s{s}``, ``<logits_key>_s{s}``; FIXTURE.md's
    atol 1e-3)."""
    for s, t in enumerate(meta["t_guidance_per_scale"]):
        assert torch.equal(recorded[s]["tokens"], ref[f"idx_s{s}"]), s
        raw = recorded[s]["logits"]
        logits = (1 + t) * raw[:batch_size] - t * raw[batch_size:] if raw.shape[0] > batch_size else raw
        torch.testing.assert_close(
            logits.topk(2, dim=-1).values, ref[f"{logits_key}_top2_values_s{s}"], atol=1e-3, rtol=0
        )
        if f"{logits_key}_s{s}" in ref:
            torch.testing.assert_close(logits, ref[f"{logits_key}_s{s}"], atol=1e-3, rtol=0)


class LoggingMixer:
    """A mixing route's mixer that records, under ``log[key]``, the stream it saw and what it drew
    (``(x, positions, projection)``)."""

    def __init__(self, mixer, key, log):
        self.mixer, self.key, self.log = mixer, key, log

    def __call__(self, x):
        positions, projection = self.mixer(x)
        self.log[self.key] = (x.clone(), positions.clone(), projection.clone())
        return positions, projection
