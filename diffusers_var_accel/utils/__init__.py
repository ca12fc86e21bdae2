"""Utilities: offline builders of tiny random-weight components (:mod:`diffusers_var_accel.utils.tiny`)."""

from .tiny import build_tiny_hart_pipeline, build_tiny_infinity_pipeline, build_tiny_qwen2, build_tiny_t5, build_tiny_tokenizer

__all__ = ["build_tiny_hart_pipeline", "build_tiny_infinity_pipeline", "build_tiny_qwen2", "build_tiny_t5", "build_tiny_tokenizer"]
