"""The validation of a pipeline call's arguments: one helper per kind of argument, so every pipeline refuses the
same bad values the same way (a clear error naming the argument, the bad value and what is allowed)."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, Sequence, Tuple

import torch


# ---------------------------------------------------------------------------------------------------------------------
class InputTypeError(TypeError, ValueError):
    """An argument of the wrong type. A ``TypeError`` that is also a ``ValueError``, so code that catches the
    pipelines' ``ValueError`` for bad input (the CLI) catches it too."""


#: The values of ``output_type`` the pipelines accept.
OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_output_type(output_type: Any) -> None:
    """``output_type`` must be one of :data:`OUTPUT_TYPES`."""
    if not isinstance(output_type, str) or output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {list(OUTPUT_TYPES)}, got {output_type!r}")


def check_positive_int(name: str, value: Any, minimum: int = 1) -> None:
    """``value`` must be an integer (not a bool or a float) >= ``minimum``."""
    if not _is_int(value):
        raise InputTypeError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_real(
    name: str, value: Any, minimum: Optional[float] = None, strictly_above: bool = False, rule: str = ""
) -> None:
    """``value`` must be a finite real number (not a bool), ``>= minimum`` (``> minimum`` with ``strictly_above``).

    ``rule`` is appended to the message (what the value means)."""
    bound = "" if minimum is None else f" {'>' if strictly_above else '>='} {minimum}"
    what = f"a finite number{bound}{rule}"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not _is_real(value):
        raise InputTypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if minimum is not None and (value <= minimum if strictly_above else value < minimum):
        raise ValueError(f"{name} must be {what}, got {value!r}")


def check_per_scale(
    name: str,
    values: Any,
    num_scales: int,
    minimum: Optional[float] = None,
    strictly_above: bool = False,
    rule: str = "",
    schedule_text: str = "the model",
) -> None:
    """``values`` must be a sequence of ``num_scales`` finite numbers, each as :func:`check_real` demands."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise InputTypeError(f"{name} must be a list of {num_scales} numbers (one per scale), got {values!r}")
    values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    if len(values) != num_scales:
        raise ValueError(
            f"{name} has {len(values)} values; {schedule_text} has {num_scales} scales (one value per scale)"
        )
    for i, v in enumerate(values):
        check_real(f"{name}[{i}]", v, minimum, strictly_above, rule)


def check_prompt_argument(name: str, prompt: Any, required: bool = False) -> None:
    """``prompt`` must be ``None`` (unless ``required``), a str, or a non-empty list / tuple of str."""
    if prompt is None and not required:
        return
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, (list, tuple)):
        raise InputTypeError(f"{name} must be a str or a list of str, got {prompt!r} ({type(prompt).__name__})")
    if len(prompt) == 0:
        raise ValueError(f"{name} is an empty list: pass at least one prompt (a str or a list of str)")
    for i, p in enumerate(prompt):
        if not isinstance(p, str):
            raise InputTypeError(f"{name}[{i}] is {p!r} ({type(p).__name__}); every entry of {name} must be a str")


def check_text_embeds(name: str, embeds: Any, width: int, tokens: Optional[int] = None) -> None:
    """``embeds`` must be a finite floating-point tensor ``(batch >= 1, tokens, width)`` (``tokens`` fixed when given)."""
    if embeds is None:
        return
    expected = f"(batch, {tokens if tokens is not None else 'tokens'}, {width})"
    if not isinstance(embeds, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor of text features {expected}, got {type(embeds).__name__}")
    if not embeds.is_floating_point():
        raise InputTypeError(
            f"{name} must be a floating-point tensor of text features {expected}, got dtype {embeds.dtype}"
        )
    shape = tuple(embeds.shape)
    if (
        embeds.ndim != 3
        or shape[0] < 1
        or shape[1] < 1
        or shape[2] != width
        or (tokens is not None and shape[1] != tokens)
    ):
        raise ValueError(f"{name} must be {expected} text features; got shape {shape}")
    if not torch.isfinite(embeds).all():
        bad = int((~torch.isfinite(embeds)).sum())
        raise ValueError(f"{name} contains {bad} non-finite values (NaN or inf); text features must be finite")


def check_generator(name: str, generator: Any) -> None:
    """``generator`` must be ``None``, a ``torch.Generator`` or a non-empty list of them."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if isinstance(generator, (list, tuple)) and generator:
        for i, g in enumerate(generator):
            if not isinstance(g, torch.Generator):
                raise InputTypeError(
                    f"{name}[{i}] is {g!r} ({type(g).__name__}); {name} must be a torch.Generator or a list "
                    "of them (one per image)"
                )
        return
    raise InputTypeError(
        f"{name} must be a torch.Generator, a list of them (one per image) or None, got {generator!r} "
        f"({type(generator).__name__}); e.g. torch.Generator().manual_seed(0)"
    )


def check_generator_count(name: str, generator: Any, batch_size: int) -> None:
    """A list of generators must hold one per image."""
    if isinstance(generator, (list, tuple)) and len(generator) != batch_size:
        raise ValueError(f"got {len(generator)} {name}s for {batch_size} images; pass one per image or a single one")


def resolve_size(height: Any, width: Any, default_hw: Tuple[int, int]) -> Tuple[int, int]:
    """``(height, width)``: both given (positive integers), or neither (the model's default size)."""
    default_text = f"{default_hw[0]}x{default_hw[1]}"
    if height is None and width is None:
        return default_hw
    if height is None or width is None:
        given, missing = ("height", "width") if width is None else ("width", "height")
        raise ValueError(
            f"{given}={height if width is None else width!r} was given without {missing}: pass both or "
            f"neither (the default size is {default_text})"
        )
    for name, value in (("height", height), ("width", width)):
        if not _is_int(value):
            raise InputTypeError(f"{name} must be a positive integer (pixels), got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(
                f"{name} must be a positive integer (pixels), got {value!r} (the default size is {default_text})"
            )
    return int(height), int(width)


def check_max_sequence_length(value: Any) -> None:
    """``max_sequence_length`` must be ``None`` (the model's length) or an integer >= 1."""
    if value is not None:
        check_positive_int("max_sequence_length", value)


def warn_if_truncated(
    tokenizer, prompts: Sequence[str], max_length: int, what: str = "the text encoder's input"
) -> None:
    """Warn, naming the lengths, when prompts are longer than ``max_length`` tokens (they are truncated)."""
    lengths = [len(ids) for ids in tokenizer(list(prompts), truncation=False).input_ids]
    long = [(i, n) for i, n in enumerate(lengths) if n > max_length]
    if long:
        listed = ", ".join(f"prompt {i}: {n} tokens" for i, n in long[:5]) + (" ..." if len(long) > 5 else "")
        warnings.warn(
            f"{len(long)} prompt(s) longer than {what} ({max_length} tokens) truncated to {max_length} tokens "
            f"({listed})",
            UserWarning,
            stacklevel=3,
        )


def warn_unused_negative(negative_prompt: Any, negative_prompt_embeds: Any, guidance_off: bool, off_text: str) -> None:
    """Warn that a negative prompt is not used when no scale is guided (it only enters the CFG rows)."""
    if guidance_off and (negative_prompt is not None or negative_prompt_embeds is not None):
        name = "negative_prompt" if negative_prompt is not None else "negative_prompt_embeds"
        warnings.warn(
            f"{name} is ignored: no scale is guided ({off_text}); it only enters the classifier-free guidance rows",
            UserWarning,
            stacklevel=3,
        )


def check_teacher_tokens(
    teacher_tokens: Any,
    expected_shapes: Sequence[Tuple[int, ...]],
    alternatives: Sequence[str] = (),
    integer_range: Optional[Tuple[int, int]] = None,
) -> None:
    """``teacher_tokens`` must be a list of at most ``len(expected_shapes)`` tensors, the ``i``-th of shape
    ``expected_shapes[i]`` (or the same number of elements per image: ``alternatives[i]`` describes it), holding
    integers in ``integer_range`` (inclusive) when given."""
    if teacher_tokens is None:
        return
    if isinstance(teacher_tokens, torch.Tensor) or not isinstance(teacher_tokens, (list, tuple)):
        raise InputTypeError(
            f"teacher_tokens must be a list of tensors (one per scale, from the first), got "
            f"{type(teacher_tokens).__name__}"
        )
    if len(teacher_tokens) > len(expected_shapes):
        raise ValueError(
            f"teacher_tokens has {len(teacher_tokens)} entries; the schedule has {len(expected_shapes)} scales"
        )
    for si, tokens in enumerate(teacher_tokens):
        shape = expected_shapes[si]
        alt = f" or {alternatives[si]}" if si < len(alternatives) and alternatives[si] else ""
        if not isinstance(tokens, torch.Tensor):
            raise InputTypeError(
                f"teacher_tokens[{si}] must be a tensor of shape {shape}{alt}, got {type(tokens).__name__}"
            )
        if tokens.ndim == 0 or tokens.shape[0] != shape[0] or tokens.numel() != math.prod(shape):
            raise ValueError(
                f"teacher_tokens[{si}] must have shape {shape}{alt} (batch {shape[0]}, scale {si}); "
                f"got {tuple(tokens.shape)}"
            )
        if tokens.is_floating_point() and not torch.equal(tokens, tokens.round()):
            raise ValueError(f"teacher_tokens[{si}] must hold integers, got non-integer values")
        if integer_range is not None and tokens.numel():
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < integer_range[0] or hi > integer_range[1]:
                raise ValueError(
                    f"teacher_tokens[{si}] values must be in [{integer_range[0]}, {integer_range[1]}], got "
                    f"values in [{lo}, {hi}]"
                )
