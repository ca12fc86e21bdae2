"""What the Infinity and HART pipelines share around the one next-scale loop: token sampling, the per-scale
callback, the pipeline properties diffusers users read, decoding to the requested output type, and the validation of
the call's arguments (one helper per kind of argument, so both pipelines refuse the same bad values the same way)."""

from __future__ import annotations

import contextlib
import collections
import json
import math
import numbers
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput

from ..next_scale.cache import ScaleKVCache
from ..schedulers.presets import close_names

GeneratorArg = Union[None, torch.Generator, Sequence[torch.Generator]]


def mask_top_k_top_p(logits_BNV: torch.Tensor, top_k: Optional[int], top_p: Optional[float]) -> torch.Tensor:
    """A float copy of the logits with everything outside the top-k (ties kept; k is clamped to V) and outside the
    top-p nucleus (the low-probability tail whose mass is <= 1 - top_p) set to -inf. 0 / None disable either."""
    logits = logits_BNV.float()
    if logits is logits_BNV:  # already fp32: copy, the masks below write in place; a cast is a new tensor already
        logits = logits.clone()
    V = logits.shape[-1]
    k = min(int(top_k), V) if top_k and top_k > 0 else V
    if k < V:  # k = V keeps every logit (the k-th largest is the smallest): nothing to mask
        kth = logits.topk(k, dim=-1, largest=True, sorted=False)[0].amin(dim=-1, keepdim=True)
        logits.masked_fill_(logits < kth, float("-inf"))
    if top_p is not None and top_p > 0:
        if V == 2 and top_p > 0.5:
            # Two classes (Infinity's bits): the nucleus drops the smaller one when its probability is <= 1 - top_p.
            # With 1 - top_p < 1/2 only the strictly smaller class can qualify, and its cumulative mass in ascending
            # order is its own probability (a softmax over two values does not depend on their order), so the
            # sort / cumsum / scatter of the general case gives exactly this mask.
            logits.masked_fill_(logits.softmax(dim=-1) <= (1 - top_p), float("-inf"))
        else:
            sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
            remove_sorted = sorted_logits.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
            remove_sorted[..., -1:] = False
            logits.masked_fill_(remove_sorted.scatter(-1, sorted_idx, remove_sorted), float("-inf"))
    return logits


#: The dynamo cache size limit ``compile_passes`` sets at least (each pass of each plan is one cached graph).
PASS_GRAPH_CACHE_LIMIT = 256

#: The sampling modes of the pipelines (``pipe.set_sampling``).
SAMPLING_MODES = ("device", "official")


def check_sampling_mode(mode: Any) -> str:
    """``mode`` must be one of :data:`SAMPLING_MODES`."""
    if not isinstance(mode, str) or mode not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {list(SAMPLING_MODES)}, got {mode!r}")
    return mode


def sample_categorical(masked_logits_BNV: torch.Tensor, generator: GeneratorArg, mode: str = "device") -> torch.Tensor:
    """One draw from each of the ``B * N`` distributions of the (masked) logits: ``(B, N)`` int64.

    One generator draws all of the batch at once (the official draws), a list of generators one image each (an image
    then does not depend on its batch). Draws run on the generator's device.

    ``mode="official"`` calls ``torch.multinomial(probs, 1)``; ``mode="device"`` draws the same exponential race
    ``argmax(probs / Exp(1))`` that ``multinomial`` computes for one sample, without its host-side checks of the
    probabilities (a device-to-host sync per call on CUDA). Both consume the generator identically and give the same
    tokens on the CPU (``tests/test_sampling.py``).
    """
    B, N, V = masked_logits_BNV.shape
    probs = masked_logits_BNV.softmax(dim=-1)
    draw = _multinomial if check_sampling_mode(mode) == "official" else _exponential_race
    if isinstance(generator, (list, tuple)):
        return torch.stack([draw(probs[b].view(-1, V), generator[b]).view(N) for b in range(B)])
    return draw(probs.view(-1, V), generator).view(B, N)


def _multinomial(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    device = generator.device if generator is not None else probs_NV.device
    out = torch.multinomial(probs_NV.to(device), num_samples=1, replacement=True, generator=generator)
    return out.to(probs_NV.device)


def _exponential_race(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    # the one-sample branch of torch.multinomial: q ~ Exp(1) of the probabilities' shape, argmax(p / q)
    device = generator.device if generator is not None else probs_NV.device
    probs = probs_NV.to(device)
    race = probs.div(torch.empty_like(probs).exponential_(generator=generator))
    return race.argmax(dim=-1, keepdim=True).to(probs_NV.device)


# ---------------------------------------------------------------------------------------------------------------------
# input validation shared by the pipelines: each helper names the argument, the bad value and what is allowed
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


def check_real(name: str, value: Any, minimum: Optional[float] = None, strictly_above: bool = False, rule: str = "") -> None:
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


def check_per_scale(name: str, values: Any, num_scales: int, minimum: Optional[float] = None, strictly_above: bool = False,
                    rule: str = "", schedule_text: str = "the model") -> None:
    """``values`` must be a sequence of ``num_scales`` finite numbers, each as :func:`check_real` demands."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, torch.Tensor)):
        raise InputTypeError(f"{name} must be a list of {num_scales} numbers (one per scale), got {values!r}")
    values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    if len(values) != num_scales:
        raise ValueError(f"{name} has {len(values)} values; {schedule_text} has {num_scales} scales (one value per scale)")
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
        raise InputTypeError(f"{name} must be a floating-point tensor of text features {expected}, got dtype {embeds.dtype}")
    shape = tuple(embeds.shape)
    if embeds.ndim != 3 or shape[0] < 1 or shape[1] < 1 or shape[2] != width or (tokens is not None and shape[1] != tokens):
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
                raise InputTypeError(f"{name}[{i}] is {g!r} ({type(g).__name__}); {name} must be a torch.Generator or a list "
                                     "of them (one per image)")
        return
    raise InputTypeError(f"{name} must be a torch.Generator, a list of them (one per image) or None, got {generator!r} "
                         f"({type(generator).__name__}); e.g. torch.Generator().manual_seed(0)")


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
        raise ValueError(f"{given}={height if width is None else width!r} was given without {missing}: pass both or "
                         f"neither (the default size is {default_text})")
    for name, value in (("height", height), ("width", width)):
        if not _is_int(value):
            raise InputTypeError(f"{name} must be a positive integer (pixels), got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer (pixels), got {value!r} (the default size is {default_text})")
    return int(height), int(width)


def check_max_sequence_length(value: Any) -> None:
    """``max_sequence_length`` must be ``None`` (the model's length) or an integer >= 1."""
    if value is not None:
        check_positive_int("max_sequence_length", value)


def warn_if_truncated(tokenizer, prompts: Sequence[str], max_length: int, what: str = "the text encoder's input") -> None:
    """Warn, naming the lengths, when prompts are longer than ``max_length`` tokens (they are truncated)."""
    lengths = [len(ids) for ids in tokenizer(list(prompts), truncation=False).input_ids]
    long = [(i, n) for i, n in enumerate(lengths) if n > max_length]
    if long:
        listed = ", ".join(f"prompt {i}: {n} tokens" for i, n in long[:5]) + (" ..." if len(long) > 5 else "")
        warnings.warn(f"{len(long)} prompt(s) longer than {what} ({max_length} tokens) truncated to {max_length} tokens "
                      f"({listed})", UserWarning, stacklevel=3)


def warn_unused_negative(negative_prompt: Any, negative_prompt_embeds: Any, guidance_off: bool, off_text: str) -> None:
    """Warn that a negative prompt is not used when no scale is guided (it only enters the CFG rows)."""
    if guidance_off and (negative_prompt is not None or negative_prompt_embeds is not None):
        name = "negative_prompt" if negative_prompt is not None else "negative_prompt_embeds"
        warnings.warn(f"{name} is ignored: no scale is guided ({off_text}); it only enters the classifier-free "
                      "guidance rows", UserWarning, stacklevel=3)


def check_teacher_tokens(teacher_tokens: Any, expected_shapes: Sequence[Tuple[int, ...]], alternatives: Sequence[str] = (),
                         integer_range: Optional[Tuple[int, int]] = None) -> None:
    """``teacher_tokens`` must be a list of at most ``len(expected_shapes)`` tensors, the ``i``-th of shape
    ``expected_shapes[i]`` (or the same number of elements per image: ``alternatives[i]`` describes it), holding
    integers in ``integer_range`` (inclusive) when given."""
    if teacher_tokens is None:
        return
    if isinstance(teacher_tokens, torch.Tensor) or not isinstance(teacher_tokens, (list, tuple)):
        raise InputTypeError(f"teacher_tokens must be a list of tensors (one per scale, from the first), got "
                             f"{type(teacher_tokens).__name__}")
    if len(teacher_tokens) > len(expected_shapes):
        raise ValueError(f"teacher_tokens has {len(teacher_tokens)} entries; the schedule has {len(expected_shapes)} scales")
    for si, tokens in enumerate(teacher_tokens):
        shape = expected_shapes[si]
        alt = f" or {alternatives[si]}" if si < len(alternatives) and alternatives[si] else ""
        if not isinstance(tokens, torch.Tensor):
            raise InputTypeError(f"teacher_tokens[{si}] must be a tensor of shape {shape}{alt}, got {type(tokens).__name__}")
        if tokens.ndim == 0 or tokens.shape[0] != shape[0] or tokens.numel() != math.prod(shape):
            raise ValueError(f"teacher_tokens[{si}] must have shape {shape}{alt} (batch {shape[0]}, scale {si}); "
                             f"got {tuple(tokens.shape)}")
        if tokens.is_floating_point() and not torch.equal(tokens, tokens.round()):
            raise ValueError(f"teacher_tokens[{si}] must hold integers, got non-integer values")
        if integer_range is not None and tokens.numel():
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < integer_range[0] or hi > integer_range[1]:
                raise ValueError(f"teacher_tokens[{si}] values must be in [{integer_range[0]}, {integer_range[1]}], got "
                                 f"values in [{lo}, {hi}]")


# ---------------------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------------------
from ..families import MODEL_FAMILIES  # noqa: E402  (the registry imports nothing: no circle)

#: The pipeline classes a saved folder's ``model_index.json`` may name: the registered families', sorted.
PIPELINE_CLASS_NAMES = tuple(sorted(family.pipeline_class_name for family in MODEL_FAMILIES.values()))


def prepare_pipeline_loading(cls, pretrained_model_name_or_path, kwargs: Dict[str, Any],
                             packaged: Optional[Dict[str, Callable[[], Any]]] = None):
    """What ``from_pretrained`` of a VAR pipeline passes on to diffusers: ``(path, kwargs)``.

    * a packaged name (``packaged``: name -> function returning its folder) becomes its folder; a name close to one
      (a typo, e.g. ``"embeded"``) that is neither a folder nor a Hub repo id (``org/name``) is an error suggesting it;
    * ``torch_dtype`` (the name diffusers 0.42 deprecates) is passed on as ``dtype``; a string dtype (``"float16"``,
      ``"torch.bfloat16"``, also in a per-component dict) becomes the ``torch.dtype``; an unknown one is refused
      (diffusers would fall back to float32);
    * a local folder's ``model_index.json`` must be valid JSON and name ``cls`` (with or without the Hub shim): a
      class that does not exist or another pipeline's class is an error naming it and the allowed ones; every
      component folder it lists must exist, with valid JSON files and readable safetensors files (an error names the
      file), so that no library fails later with a message that names no file.
    """
    from ..models.checkpoint_utils import CheckpointFileError, check_folder_files, resolve_torch_dtype

    packaged = packaged or {}
    kwargs = dict(kwargs)
    if "torch_dtype" in kwargs:
        # diffusers 0.42 renamed it ``dtype`` (and warns on every load); both names are accepted here, one at a time
        if kwargs.get("dtype") is not None and kwargs["torch_dtype"] is not None:
            raise ValueError("pass dtype or torch_dtype (its older name), not both")
        torch_dtype = kwargs.pop("torch_dtype")
        if torch_dtype is not None:
            kwargs["dtype"] = torch_dtype
    if "dtype" in kwargs:
        value = kwargs["dtype"]
        kwargs["dtype"] = ({k: resolve_torch_dtype(v, f"dtype[{k!r}]") for k, v in value.items()} if isinstance(value, dict)
                           else resolve_torch_dtype(value, "dtype"))
    path = pretrained_model_name_or_path
    if isinstance(path, str) and path in packaged:
        return packaged[path](), kwargs
    if isinstance(path, str) and not os.path.exists(path) and "/" not in path and os.sep not in path:
        hint = close_names(path, list(packaged))
        if hint:
            raise FileNotFoundError(f"{path!r} is not a folder, a Hub repo id ('org/name') or a packaged model name{hint}; "
                                    f"packaged: {sorted(packaged)}")
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
        index_file = os.path.join(os.fspath(path), "model_index.json")
        if not os.path.isfile(index_file):
            raise FileNotFoundError(f"{path} has no model_index.json: not a folder written by {cls.__name__}.save_pretrained")
        try:
            with open(index_file, encoding="utf-8") as f:
                index = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointFileError(f"{index_file} is not valid JSON: {err}") from None
        stored = index.get("_class_name") if isinstance(index, dict) else None
        name = stored[1] if isinstance(stored, list) and len(stored) == 2 else stored
        if name not in [c.__name__ for c in cls.__mro__]:  # the class itself or a pipeline class it extends
            if name in PIPELINE_CLASS_NAMES:
                raise ValueError(f"{index_file} holds a {name}, not a {cls.__name__}: load it with {name}.from_pretrained")
            hint = close_names(name, PIPELINE_CLASS_NAMES) if isinstance(name, str) else ""
            raise ValueError(f"{index_file} names the pipeline class {stored!r}, which does not exist{hint}; "
                             f"allowed: {list(PIPELINE_CLASS_NAMES)}")
        # components passed to from_pretrained are not read from the folder
        stored_components = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v[0] is not None
                             and k not in kwargs]
        missing = [k for k in stored_components if not os.path.isdir(os.path.join(os.fspath(path), k))]
        if missing:
            raise FileNotFoundError(f"{path}: model_index.json lists the component(s) {missing} but their folders are missing")
        for component in stored_components:
            check_folder_files(os.path.join(os.fspath(path), component))
        # a component the folder was saved without (``[null, null]``: a pipeline built with text_encoder=None) stays
        # None: diffusers loads only optional components that way, and the text encoder and tokenizer are required
        # arguments (as in diffusers' text-to-image pipelines) that a pipeline may still set to None
        for name, value in index.items():
            if (not name.startswith("_") and isinstance(value, list) and len(value) == 2 and value[0] is None
                    and value[1] is None and name not in kwargs and name not in cls._optional_components):
                kwargs[name] = None
    return path, kwargs


@contextlib.contextmanager
def no_nested_progress_bars():
    """transformers' own "Loading weights" bar off while diffusers' "Loading pipeline components" bar runs: a bar
    nested in another writes cursor-up escapes (``\x1b[A``) that litter every log that is not a terminal."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def save_pipeline_folder(pipe, save_directory, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """``DiffusionPipeline.save_pretrained(save_directory, *args, **kwargs)`` written into a temporary sibling folder
    and moved into place entry by entry, ``model_index.json`` last (:func:`~diffusers_var_accel.files.
    save_folder_atomically`): a process killed while saving leaves no half-written file, and the same save again
    completes. With ``push_to_hub`` diffusers' own saving runs unchanged (it uploads from the folder it wrote)."""
    from diffusers.pipelines.pipeline_utils import DiffusionPipeline

    from ..files import save_folder_atomically

    if kwargs.get("push_to_hub"):
        DiffusionPipeline.save_pretrained(pipe, save_directory, *args, **kwargs)
        return
    save_folder_atomically(save_directory, lambda tmp: DiffusionPipeline.save_pretrained(pipe, tmp, *args, **kwargs))


def check_loaded_pipeline(pipe, path, passed: Sequence[str] = ()) -> None:
    """After ``from_pretrained`` of a local folder: the transformers components (text encoders) it read held exactly
    their model's weights (our own models check themselves when they load; transformers would fill missing weights at
    random with only a log line). Components in ``passed`` were given to ``from_pretrained``, not read."""
    if not (isinstance(path, (str, os.PathLike)) and os.path.isdir(path)):
        return
    from transformers import PreTrainedModel

    from ..models.checkpoint_utils import check_loaded_keys

    for name, component in pipe.components.items():
        if isinstance(component, PreTrainedModel) and name not in passed:
            check_loaded_keys(component, os.path.join(os.fspath(path), name))


class LiveGuidance(Sequence):
    """The loop's per-scale guidance, read from the pipeline's ``_guidance_scale`` when the loop reaches each scale.

    ``_guidance_scale`` holds what the call was given: one number (``guidance_scale``) or one value per scale
    (``cfg_list``). A ``callback_on_step_end`` may replace it with either form (diffusers' ``callback_cfg``
    convention: ``pipe._guidance_scale += 1``) and the change applies from the next scale on. ``per_scale(value,
    num_scales)`` turns a number into the family's per-scale values in the loop's convention (1 = no guidance).

    The unconditional rows are set up when the call starts; a callback may not turn guidance on in a call that
    started without it (there are no unconditional rows to guide with).
    """

    def __init__(self, pipeline, num_scales: int, per_scale: Callable[[float, int], List[float]],
                 list_to_loop: Callable[[float], float] = float):
        self._pipeline, self._num_scales = pipeline, num_scales
        self._per_scale, self._list_to_loop = per_scale, list_to_loop
        self._with_cfg = any(self._resolve(si) != 1 for si in range(num_scales))

    def _resolve(self, si: int) -> float:
        value = self._pipeline._guidance_scale
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(self._per_scale(float(value), self._num_scales)[si])
        if isinstance(value, (list, tuple)) and len(value) == self._num_scales and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
            return float(self._list_to_loop(float(value[si])))
        raise ValueError(f"_guidance_scale must be a number or a list of {self._num_scales} numbers (one per scale); "
                         f"got {value!r}")

    def __len__(self) -> int:
        return self._num_scales

    def __getitem__(self, si):
        if isinstance(si, slice):
            return [self[i] for i in range(*si.indices(self._num_scales))]
        value = self._resolve(si)
        if value != 1 and not self._with_cfg:
            raise ValueError(f"guidance at scale {si} was changed to {self._pipeline._guidance_scale!r}, but this call "
                             "started without guidance, so no unconditional rows ran; start the call with guidance on")
        return value


#: dynamo's process-wide cache limits before the first pipeline compiled its passes, and how many pipelines do now
_GRAPH_CACHE_STATE: Dict[str, Any] = {"pipelines": 0, "saved": None}
_GRAPH_CACHE_LIMITS = (("cache_size_limit", PASS_GRAPH_CACHE_LIMIT), ("accumulated_cache_size_limit", 4 * PASS_GRAPH_CACHE_LIMIT))


def _raise_graph_cache_limits() -> None:
    """Raise dynamo's cache limits above the graphs of a few plans (one graph per pass), remembering the old values,
    and make hitting them an error: past the limit dynamo would otherwise run the pass eagerly without a word."""
    import torch._dynamo

    config = torch._dynamo.config
    if _GRAPH_CACHE_STATE["pipelines"] == 0:
        _GRAPH_CACHE_STATE["saved"] = {name: getattr(config, name) for name, _ in _GRAPH_CACHE_LIMITS if hasattr(config, name)}
        if hasattr(config, "fail_on_recompile_limit_hit"):
            _GRAPH_CACHE_STATE["saved"]["fail_on_recompile_limit_hit"] = config.fail_on_recompile_limit_hit
    _GRAPH_CACHE_STATE["pipelines"] += 1
    for name, limit in _GRAPH_CACHE_LIMITS:
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def cudagraph_skips() -> int:
    """How many times torch.compile's CUDA-graph trees have run a graph without capturing or replaying it (a skip:
    mutated inputs, CPU tensors, dynamic shapes...) in this process."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


class CompiledPassRunner:
    """The ``pass_runner`` of a pipeline whose passes are compiled: runs ``torch.compile(run_family_blocks)`` and
    reports, instead of hiding, the passes that ran without CUDA graphs when graphs were asked for.

    The KV cache lives here, one per (schedule, batch, rows, family, plan), as in
    :class:`~diffusers_var_accel.next_scale.graphs.PassGraphs`: the loop asks :meth:`kv_cache` for it, and a call with
    the same key gets the same buffers back (reset), so compiled passes and their CUDA graphs see the same addresses
    call after call. The buffers are allocated by the first pass of a call (the start token alone: the smallest
    pass), which therefore runs **eagerly** in every call, never inside a graph (CUDA-graph trees would own buffers
    born there and skip every later pass that writes them for "mutated inputs"); they are then marked static
    addresses (``torch._dynamo.mark_static_address``) for the compiled passes.

    Attributes:
        skipped_passes (`int`): passes run so far for which CUDA-graph trees reported a skip (only counted when
            graphs are on).
        eager_first_passes (`int`): first passes run eagerly (one per call).
    """

    def __init__(self, compiled: Callable, cuda_graphs: bool, max_workspaces: int = 4):
        self.compiled, self.cuda_graphs = compiled, cuda_graphs
        self.max_workspaces = max_workspaces
        self.skipped_passes = self.eager_first_passes = 0
        self._warned = False
        self._caches: "collections.OrderedDict[Any, ScaleKVCache]" = collections.OrderedDict()

    def kv_cache(self, key, num_layers: int, max_length: int) -> ScaleKVCache:
        """The KV cache of a call whose schedule, batch, rows, family and plan make ``key``: the one of the last call
        with that key, reset (its buffers kept), or a new one (the least recently used beyond ``max_workspaces``
        is dropped)."""
        key = (key, num_layers, max_length)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = ScaleKVCache(num_layers, max_length=max_length)
            while len(self._caches) > self.max_workspaces:
                self._caches.popitem(last=False)
        self._caches.move_to_end(key)
        cache.reset()
        return cache

    def __call__(self, family, hidden_RLC, condition, context):
        import torch._dynamo

        from ..next_scale.graphs import refuse_drawing_passes
        from ..next_scale.loop import run_family_blocks

        refuse_drawing_passes(context, "compile_passes()")
        cache = context.kv_cache
        if cache is not None and cache.preallocated and cache.empty and cache.stores:
            allocated = cache.allocated
            out = run_family_blocks(family, hidden_RLC, condition, context)  # allocates the buffers, outside graphs
            self.eager_first_passes += 1
            if not allocated:
                for buffer in cache.buffers():
                    torch._dynamo.mark_static_address(buffer, guard=False)
            return out
        before = cudagraph_skips() if self.cuda_graphs else 0
        out = self.compiled(family, hidden_RLC, condition, context)
        if self.cuda_graphs and cudagraph_skips() > before:
            self.skipped_passes += 1
            if not self._warned:
                self._warned = True
                warnings.warn("enable_cuda_graphs(): CUDA-graph trees skipped a pass, which then ran without graphs (its "
                              "time is not a graph replay's); TORCH_LOGS=cudagraphs prints why, and "
                              "enable_cuda_graphs(strict=True) raises at the first skip. pipe.passes_without_graphs counts "
                              "them", UserWarning, stacklevel=2)
        return out


def _restore_graph_cache_limits() -> None:
    """Give dynamo back its cache limits when the last pipeline with compiled passes goes back to eager."""
    import torch._dynamo

    _GRAPH_CACHE_STATE["pipelines"] = max(_GRAPH_CACHE_STATE["pipelines"] - 1, 0)
    if _GRAPH_CACHE_STATE["pipelines"] == 0 and _GRAPH_CACHE_STATE["saved"] is not None:
        for name, value in _GRAPH_CACHE_STATE["saved"].items():
            setattr(torch._dynamo.config, name, value)
        _GRAPH_CACHE_STATE["saved"] = None


class NextScalePipelineMixin:
    """Properties and steps common to the next-scale pipelines (mixed into ``DiffusionPipeline`` subclasses)."""

    _interrupt = False
    _sampling = "device"
    _pass_runner: Optional[Callable] = None

    # -- compiled passes and CUDA graphs ------------------------------------------------------------------------------
    def compile_passes(self, backend: Union[str, Callable] = "inductor", fullgraph: bool = True, mode: Optional[str] = None,
                       **options: Any) -> None:
        """Run the transformer blocks of every pass through ``torch.compile`` from the next call on.

        Each pass (the blocks over its scales' tokens, with its acceleration routes) becomes one graph, compiled on
        its first run with static shapes; a later call with the same size, batch and acceleration plan replays the
        graphs without recompiling. The head, guidance, sampling and the tokenizer steps between passes stay eager.

        Args:
            backend (`str` or callable, defaults to `"inductor"`): the ``torch.compile`` backend (``"eager"`` and
                ``"aot_eager"`` check the capture on a CPU without generating code).
            fullgraph (`bool`, defaults to `True`): a graph break inside a pass is an error instead of a split graph.
            mode (`str`, *optional*): the ``torch.compile`` mode (``"reduce-overhead"``: CUDA graphs).
            **options: passed on to ``torch.compile``.

        Dynamo's process-wide cache size limits are raised above the number of passes of a few plans (each pass is its
        own graph) while a pipeline compiles its passes; ``disable_cuda_graphs()`` goes back to eager passes and, for
        the last such pipeline, to the limits as they were.
        """
        import torch._dynamo

        from ..next_scale.loop import run_family_blocks

        if not self.__dict__.get("_graph_limits_raised", False):
            self.disable_cuda_graphs()  # captured graphs (if any) are dropped
            _raise_graph_cache_limits()
            self._graph_limits_raised = True
        options.setdefault("dynamic", False)  # one static graph per pass: shapes never depend on the data
        compiled = torch.compile(run_family_blocks, backend=backend, fullgraph=fullgraph, mode=mode, **options)
        self._pass_runner = CompiledPassRunner(compiled, cuda_graphs=mode in ("reduce-overhead", "max-autotune"))

    def compile_repeated_blocks(self, backend: Union[str, Callable] = "inductor", fullgraph: bool = True,
                                mode: Optional[str] = None, **options: Any) -> None:
        """Regional compilation (diffusers' ``compile_repeated_blocks``): compile the transformer's repeated,
        shape-only regions (``transformer._repeated_blocks``: the feed-forward networks, about two thirds of a
        block's FLOPs) once per token count, one compiled graph shared by every block, instead of one graph per pass.
        Everything else runs eagerly (attention, KV cache, routes, head, sampling).

        A schedule has one token count per scale (plus the routed counts of an acceleration plan), so dynamo's cache
        limits are raised as for :meth:`compile_passes`, and hitting them raises instead of running eagerly.
        ``disable_cuda_graphs()`` goes back to eager modules.

        Args:
            backend (`str` or callable, defaults to `"inductor"`): the ``torch.compile`` backend.
            fullgraph (`bool`, defaults to `True`): a graph break is an error.
            mode (`str`, *optional*): the ``torch.compile`` mode.
            **options: passed on to ``torch.compile``.
        """
        if not self.__dict__.get("_graph_limits_raised", False):
            _raise_graph_cache_limits()
            self._graph_limits_raised = True
        options.setdefault("dynamic", False)
        self.transformer.compile_repeated_blocks(backend=backend, fullgraph=fullgraph, mode=mode, **options)

    @property
    def compiled_regions(self) -> int:
        """Modules of the transformer compiled by :meth:`compile_repeated_blocks` (0: none)."""
        return sum(getattr(m, "_compiled_call_impl", None) is not None for m in self.transformer.modules())

    def enable_cuda_graphs(self, capture: str = "cuda", strict: bool = False, max_workspaces: int = 4) -> bool:
        """Capture every transformer pass as a graph on its first run and replay it from then on (one graph per size,
        batch, acceleration plan and pass). Call it after moving the pipeline to the GPU.

        ``capture="cuda"`` (the default) captures the eager pass directly as a ``torch.cuda.CUDAGraph``
        (:class:`~diffusers_var_accel.next_scale.graphs.PassGraphs`): no compiler, so a pass is ready after one warm-up
        run and one capture (seconds, where compiling each 32-block pass took minutes). The KV cache of each plan
        is allocated once, outside any graph, and reused by every call of that plan; the first call's tensors that a
        pass reads become its static inputs. ``pipe.disable_cuda_graphs()`` frees them. ``capture="compile"`` is the
        earlier route, ``torch.compile(mode="reduce-overhead", fullgraph=True)`` per pass (inductor also fuses the
        element-wise ops; minutes of compile per pass). ``capture="trace"`` is the CPU stand-in of ``"cuda"`` that
        the tests run: each pass traced once into an FX graph and replayed without its Python, on any device.

        Nothing falls back silently: with ``"compile"`` a pass that would need more graphs than dynamo's raised
        cache limit raises, and a pass that CUDA-graph trees skip (it then runs compiled but without graphs) warns
        once per pipeline and is counted in :attr:`passes_without_graphs`, or raises with ``strict=True``. Direct
        capture either captures a pass or raises.

        Args:
            capture (`str`, defaults to `"cuda"`): ``"cuda"``, ``"compile"`` or ``"trace"``.
            strict (`bool`, defaults to `False`): with ``"compile"``, raise at the first skipped graph (inductor's
                ``triton.cudagraph_or_error``, process-wide while graphs are on) instead of warning.
            max_workspaces (`int`, defaults to 4): with ``"cuda"`` / ``"trace"``, how many plans (schedule x batch x
                method) keep their KV cache and graphs; the least recently used is dropped.

        Returns:
            `bool`: whether graphs are on. ``"cuda"`` and ``"compile"`` on a device other than CUDA change nothing: a
            warning says so and the passes stay eager (``compile_passes`` compiles them without graphs on any
            device; ``capture="trace"`` runs anywhere).
        """
        from ..next_scale.graphs import PassGraphs

        if capture not in ("cuda", "compile", "trace"):
            raise ValueError(f"capture must be 'cuda', 'compile' or 'trace', got {capture!r}")
        if not isinstance(strict, bool):
            raise ValueError(f"strict must be True or False, got {strict!r}")
        if capture == "trace":
            self.disable_cuda_graphs()
            self._pass_runner = PassGraphs("trace", max_workspaces)
            return True
        device = self._pass_device()
        if device.type != "cuda":
            warnings.warn(f"enable_cuda_graphs() does nothing on the {device.type} device: CUDA graphs need the transformer "
                          "on a CUDA GPU (move the pipeline with .to('cuda') first); passes stay eager", UserWarning,
                          stacklevel=2)
            return False
        if capture == "cuda":
            self.disable_cuda_graphs()
            self._pass_runner = PassGraphs("cuda", max_workspaces)
            return True
        self.compile_passes(backend="inductor", fullgraph=True, mode="reduce-overhead")
        if strict:
            import torch._inductor.config as inductor_config

            self._strict_graphs_saved = inductor_config.triton.cudagraph_or_error
            inductor_config.triton.cudagraph_or_error = True
        return True

    @property
    def passes_without_graphs(self) -> int:
        """Passes that ran without CUDA graphs since ``enable_cuda_graphs()`` (skipped by CUDA-graph trees); 0 when
        graphs are off."""
        runner = self._pass_runner
        return runner.skipped_passes if isinstance(runner, CompiledPassRunner) else 0

    def disable_cuda_graphs(self) -> None:
        """Run every pass eagerly again (undoes ``enable_cuda_graphs``, ``compile_passes`` and
        ``compile_repeated_blocks``). The dynamo cache size
        limits go back to their values before the first compiled pipeline once no pipeline compiles its passes."""
        saved = self.__dict__.pop("_strict_graphs_saved", None)
        if saved is not None:
            import torch._inductor.config as inductor_config

            inductor_config.triton.cudagraph_or_error = saved
        if self.__dict__.pop("_graph_limits_raised", False):
            _restore_graph_cache_limits()
        self._pass_runner = None
        for module in self.transformer.modules():  # regions of compile_repeated_blocks
            if getattr(module, "_compiled_call_impl", None) is not None:
                module._compiled_call_impl = None

    def call_default(self, argument: str) -> Any:
        """The default value of the pipeline call's ``argument`` (read from ``__call__``'s signature)."""
        import inspect

        parameter = inspect.signature(type(self).__call__).parameters.get(argument)
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise ValueError(f"{type(self).__name__}.__call__ has no argument {argument!r} with a default")
        return parameter.default

    @property
    def passes_compiled(self) -> bool:
        """Whether the transformer passes run compiled or captured (``compile_passes`` / ``enable_cuda_graphs``)."""
        return self._pass_runner is not None

    @property
    def pass_graphs(self):
        """The :class:`~diffusers_var_accel.next_scale.graphs.PassGraphs` replaying captured passes (its
        ``captured_passes`` / ``replayed_passes`` say how the passes ran), or ``None``."""
        from ..next_scale.graphs import PassGraphs

        return self._pass_runner if isinstance(self._pass_runner, PassGraphs) else None

    def _pass_device(self) -> torch.device:
        transformer = getattr(self, "transformer", None)
        parameter = next(transformer.parameters(), None) if transformer is not None else None
        return parameter.device if parameter is not None else torch.device("cpu")

    @property
    def sampling(self) -> str:
        """How tokens are drawn: ``"device"`` (the default; an exponential race with no host sync) or
        ``"official"`` (``torch.multinomial``, as the official code). See :meth:`set_sampling`."""
        return self._sampling

    def set_sampling(self, mode: str) -> None:
        """Choose how every following call draws its tokens.

        Args:
            mode (`str`): ``"device"`` draws ``argmax(probs / Exp(1))`` on the generator's device, with no host check
                (``torch.multinomial`` reads its probabilities back on CUDA, a sync per draw); ``"official"`` calls
                ``torch.multinomial(probs, 1)`` as the official code does. Both consume the generators in the same way
                and, on the CPU, give the same tokens bit for bit (``multinomial`` runs the same race for one sample).

        Raises:
            ValueError: ``mode`` is not one of ``"device"``, ``"official"``.
        """
        self._sampling = check_sampling_mode(mode)

    @property
    def guidance_scale(self):
        """The guidance of the current (or last) call: the ``guidance_scale`` number, or the per-scale list when
        ``cfg_list`` was given (or a callback set one)."""
        return self._guidance_scale

    @property
    def num_timesteps(self):
        """The number of scales of the current (or last) call."""
        return self._num_timesteps

    @property
    def interrupt(self):
        return self._interrupt

    def _scale_callback(self, callback: Optional[Callable], tensor_inputs: Sequence[str], scale_schedule, prompt_embeds, progress):
        """The loop's ``on_scale_end``: the user's ``callback_on_step_end`` (which may replace ``latents``) and the
        progress bar. A diffusers ``PipelineCallback`` / ``MultiPipelineCallbacks`` brings its own ``tensor_inputs``
        (as diffusers' pipelines take them), checked against ``_callback_tensor_inputs`` here."""
        from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            tensor_inputs = list(callback.tensor_inputs)
            bad = [k for k in tensor_inputs if k not in self._callback_tensor_inputs]
            if bad:
                raise ValueError(f"{type(callback).__name__}.tensor_inputs {bad} are not in {self._callback_tensor_inputs}")

        def on_scale_end(si: int, state) -> None:
            if callback is not None:
                values: Dict[str, Any] = {"latents": state.f_hat, "tokens": state.tokens.get(si), "logits": state.logits.get(si),
                                          "prompt_embeds": prompt_embeds}
                out = callback(self, si, tuple(scale_schedule[si]), {k: values[k] for k in tensor_inputs}) or {}
                if "latents" in out:
                    state.f_hat = out["latents"]
            progress.update()

        return on_scale_end

    def _decode_output(self, latents: torch.Tensor, output_type: str, return_dict: bool, per_image: bool = False):
        """The images in ``output_type`` (``"latent"`` returns the summed latent as is).

        ``per_image`` (a list of generators was given: each image must not depend on its batch) decodes the images
        one by one: a convolution's result depends on the batch size in its last bits (the backend picks its kernel
        by shape), which is enough to move a pixel by 1/255 after quantisation.
        """
        if output_type == "latent":
            image = latents
        else:
            latents = latents.to(self.vae.dtype)
            if per_image and latents.shape[0] > 1:
                image = torch.cat([self.vae.decode(latents[b:b + 1]) for b in range(latents.shape[0])])
            else:
                image = self.vae.decode(latents)
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return ImagePipelineOutput(images=image)
