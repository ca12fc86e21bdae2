"""Utilities: the shared parts of the families' tiny random-weight builders (:mod:`diffusers_var_accel.utils.tiny`)."""

from .tiny import TINY_VOCABULARY, build_tiny_tokenizer, randomize_weights_

__all__ = ["TINY_VOCABULARY", "build_tiny_tokenizer", "randomize_weights_"]
