"""The fair benchmark of the acceleration methods (``var-accel bench``).

:func:`run_bench` generates every (prompt, seed) with the baseline and every method, and measures latency per image
(interleaved, after a warm-up, CUDA-synchronised), FLOPs (text encoder, transformer and VAE apart), peak memory,
fidelity to the baseline image (PSNR, SSIM, LPIPS and FID* when their networks' weights are on the machine) and the
shapes scorer's accuracy; it runs the same under ``torchrun`` / ``accelerate launch``, split across processes. See
``docs/benchmark_protocol.md``.
"""

from diffusers_var_accel.lab.metrics import (
    MetricUnavailable,
    fid_star,
    frechet_distance,
    load_fid_extractor,
    load_lpips,
)
from diffusers_var_accel.lab.bench.prompts import GENEVAL_METADATA_PATH, BenchPrompt, PromptSet, load_prompt_set
from diffusers_var_accel.lab.bench.runner import (
    DEFAULT_METHODS,
    BenchSettings,
    finish_distributed,
    load_bench_pipeline,
    parse_methods,
    parse_seeds,
    run_bench,
)

__all__ = [
    "DEFAULT_METHODS",
    "GENEVAL_METADATA_PATH",
    "BenchPrompt",
    "BenchSettings",
    "MetricUnavailable",
    "PromptSet",
    "fid_star",
    "finish_distributed",
    "frechet_distance",
    "load_bench_pipeline",
    "load_fid_extractor",
    "load_lpips",
    "load_prompt_set",
    "parse_methods",
    "parse_seeds",
    "run_bench",
]
