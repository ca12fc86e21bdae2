"""What every family's tiny random-weight builder shares: seeded random weights and a word-level tokenizer.

Each family builds its own tiny pipeline next to its pipeline (``pipelines/<family>/tiny.py``, registered as the
family's ``tiny_builder`` for its ``--model`` name) from these parts. **Those are random weights**: the images are
noise-like; they exist so that the whole pipeline (text encoding, the next-scale loop, decoding,
``save_pretrained`` / ``from_pretrained``) can be exercised on a CPU in seconds, without a download. Nothing here
touches the network.

The tokenizer is a word-level tokenizer over a small fixed English vocabulary (:data:`TINY_VOCABULARY`), built with
the ``tokenizers`` library: text is NFKC-normalised and lower-cased, split on whitespace and punctuation, and ``</s>``
is appended as T5 does. **Any word that is not in the vocabulary maps to ``<unk>``** (id 2), so two prompts that
differ only in unknown words encode identically. Ids: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2.

Examples:
    ```py
    >>> import torch
    >>> from diffusers_var_accel.utils.tiny import build_tiny_tokenizer, randomize_weights_

    >>> build_tiny_tokenizer()("a red zebra").input_ids   # 'zebra' is not in the vocabulary: <unk> (2), then </s> (1)
    [15, 77, 2, 1]
    >>> layer = randomize_weights_(torch.nn.Linear(4, 4), torch.Generator().manual_seed(0))
    ```
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
from torch import nn

__all__ = ["TINY_VOCABULARY", "build_tiny_tokenizer", "randomize_weights_"]

#: The special tokens of the tiny tokenizer, in id order (T5's ids: pad 0, eos 1, unk 2).
TINY_SPECIAL_TOKENS: Tuple[str, ...] = ("<pad>", "</s>", "<unk>")

#: The fixed word list of the tiny tokenizer (ids 3, 4, ... in this order). Other words map to ``<unk>``.
TINY_VOCABULARY: Tuple[str, ...] = tuple(
    """
    , . ! ? ' - : ; ( ) " &
    a an the of in on at with and or by from to into over under above below near behind beside between through
    is are was be being its his her their this that these those it he she they we you i my your our
    one two three four five many few some several lots all each every no not very
    red orange yellow green blue purple pink brown black white gray grey gold golden silver dark light bright pale
    colorful vivid neon pastel warm cool
    big small large tiny huge little tall short long wide old young new ancient modern futuristic
    beautiful cute happy sad angry calm quiet busy empty cozy
    cat cats dog dogs fox bird birds fish horse cow sheep lion tiger bear rabbit owl eagle dragon robot
    man woman boy girl child children person people astronaut king queen knight wizard
    tree trees flower flowers grass forest mountain mountains river lake sea ocean beach island desert field garden
    sky cloud clouds sun moon star stars rain snow fog storm night day sunset sunrise morning evening winter summer
    spring autumn
    house houses castle city street road bridge tower building room kitchen window door table chair bed car
    cars train boat ship plane bicycle book cup bottle lamp clock
    apple apples banana bread cake coffee tea pizza
    water fire ice stone wood glass metal paper
    sitting standing running walking flying swimming sleeping eating reading playing holding wearing looking
    painting photo photograph picture portrait landscape illustration drawing sketch render poster
    style art oil watercolor digital cinematic realistic detailed high quality 4k 8k hd lighting shadow
    background foreground close up view top side front
    """.split()
)


# ---------------------------------------------------------------------------------------------------------------------
# weights
# ---------------------------------------------------------------------------------------------------------------------
def randomize_weights_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Overwrite every parameter of ``module`` in place with seeded random values that keep activations in range.

    Weights of rank >= 2 are ``N(0, 1 / fan_in)`` (``fan_in`` = elements of one output row: input features, or
    ``in_channels * kh * kw`` for a convolution); 1-D ``*weight`` parameters (norm gains) are ``1 + N(0, 0.05^2)``;
    other 1-D parameters (biases) ``N(0, 0.02^2)``. Infinity's special parameters get the official scales, all
    non-zero: ``scale_mul_1H11 = log(4) + N(0, 0.1^2)``, ``ada_gss`` and ``pos_start`` ``N(0, 1 / C)`` and
    ``N(0, 1 / (3C))``, ``cfg_uncond`` ``N(0, 1)`` (T5-feature scale). Buffers (e.g. the all-zero key biases) are
    left alone. Parameters are visited in ``named_parameters`` order, so a seed always gives the same weights.
    """
    with torch.no_grad():
        for name, param in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            shape, C = param.shape, param.shape[-1]
            # drawn where the generator lives: a CUDA generator fills the weights on the GPU, no host copy
            noise = torch.randn(shape, generator=generator, dtype=torch.float32, device=generator.device)
            if leaf == "scale_mul_1H11":
                value = math.log(4.0) + 0.1 * noise
            elif leaf == "ada_gss":
                value = noise / math.sqrt(C)
            elif leaf == "pos_start":
                value = noise / math.sqrt(3 * C)
            elif leaf == "cfg_uncond":
                value = noise
            elif param.ndim >= 2:
                value = noise / math.sqrt(param[0].numel())
            elif leaf.endswith("weight"):
                value = 1.0 + 0.05 * noise
            else:
                value = 0.02 * noise
            param.copy_(value.to(param.dtype))
    return module


# ---------------------------------------------------------------------------------------------------------------------
# text encoder
# ---------------------------------------------------------------------------------------------------------------------
def build_tiny_tokenizer(model_max_length: int = 64):
    """A T5-like word-level tokenizer over :data:`TINY_VOCABULARY`, as a ``transformers`` fast tokenizer.

    Lower-cases, splits on whitespace and punctuation, appends ``</s>``; unknown words become ``<unk>``. It saves with
    ``save_pretrained`` and loads back offline with ``AutoTokenizer.from_pretrained(folder)``.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS)}
    for word in TINY_VOCABULARY:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    eos_id = vocab["</s>"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        padding_side="right",
    )
