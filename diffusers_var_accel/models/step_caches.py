"""diffusers' step caches on the VAR transformers: refused when they are enabled or applied, saying why.

FirstBlockCache, MagCache, TaylorSeer, PyramidAttentionBroadcast, FasterCache, SeaCache and TextKVCache reuse a
block's (or the model's) output from one denoising step at the next, when the input has barely changed. A next-scale
loop has no such steps: each pass runs a new, larger scale whose tokens were never computed before, and the reuse
that does hold across scales is what the acceleration methods do (LazyVAR's kept tokens, FastVAR's cached scale,
DepthVAR's layer deltas). So ``enable_cache`` raises at once, naming the config, instead of installing hooks that
crash or do nothing at generation.

diffusers' ``apply_*`` functions called directly go around ``enable_cache``. ``apply_first_block_cache``,
``apply_mag_cache`` and ``apply_layer_skip`` refuse on their own (the VAR blocks are not in diffusers' block
registry). For the others, two checks: each non-leaf module of a VAR transformer carries a hook registry that refuses
a step cache's hook before it is installed (:class:`VARHookRegistry`), and the transformer's ``named_modules`` raises
when one of those ``apply_*`` functions walks it, so that a pattern matching none of its modules (TaylorSeer's
defaults on Infinity) is refused too instead of hooking nothing.
"""

from __future__ import annotations

import sys

from diffusers.hooks import HookRegistry, apply_faster_cache, apply_pyramid_attention_broadcast, apply_taylorseer_cache
from diffusers.models.cache_utils import CacheMixin

STEP_CACHE_REFUSAL = (
    "{config} caches across the denoising steps of a diffusion loop, and {model}'s next-scale loop has none (each "
    "pass computes a new scale's tokens): use pipe.enable_acceleration(...) (fastvar, lazyvar, depthvar, arvar, "
    "stagevar), which reuse what holds across scales"
)

# The diffusers function that installs each step cache's hooks, by the hook's class name (diffusers 0.42's names).
STEP_CACHE_HOOKS = {
    "PyramidAttentionBroadcastHook": "apply_pyramid_attention_broadcast",
    "FasterCacheDenoiserHook": "apply_faster_cache",
    "FasterCacheBlockHook": "apply_faster_cache",
    "TaylorSeerCacheHook": "apply_taylorseer_cache",
    "FBCHeadBlockHook": "apply_first_block_cache",
    "FBCBlockHook": "apply_first_block_cache",
    "MagCacheHeadHook": "apply_mag_cache",
    "MagCacheBlockHook": "apply_mag_cache",
    "SeaCacheRootHook": "apply_sea_cache",
    "SeaCacheLeaderBlockHook": "apply_sea_cache",
    "SeaCacheBlockHook": "apply_sea_cache",
    "SeaCachePostNormHook": "apply_sea_cache",
    "TextKVCacheTransformerHook": "apply_text_kv_cache",
    "TextKVCacheBlockHook": "apply_text_kv_cache",
}

# The apply functions that walk ``module.named_modules()`` and hook what their name patterns match.
_WALKING_APPLY_FUNCTIONS = {
    fn.__code__: fn.__name__ for fn in (apply_pyramid_attention_broadcast, apply_taylorseer_cache, apply_faster_cache)
}


def step_cache_refusal(what: str, model) -> ValueError:
    """The refusal of the step cache ``what`` (a config's class or an ``apply_*`` function's name) on ``model``."""
    return ValueError(STEP_CACHE_REFUSAL.format(config=what, model=type(model).__name__))


class VARHookRegistry(HookRegistry):
    """diffusers' per-module ``HookRegistry``, refusing the step caches' hooks (:data:`STEP_CACHE_HOOKS`) before they
    are installed; every other hook (layerwise casting, ...) registers as usual."""

    def __init__(self, module_ref, model) -> None:
        super().__init__(module_ref)
        self._model_name = type(model).__name__

    def register_hook(self, hook, name: str) -> None:
        apply = STEP_CACHE_HOOKS.get(type(hook).__name__)
        if apply is not None:
            raise ValueError(
                STEP_CACHE_REFUSAL.format(config=f"{apply} ({type(hook).__name__})", model=self._model_name)
            )
        super().register_hook(hook, name)


class VARStepCacheMixin(CacheMixin):
    """diffusers' ``CacheMixin`` API, whose every cache is refused with :data:`STEP_CACHE_REFUSAL`, and the refusal
    of diffusers' step-cache ``apply_*`` functions called on the model (see the module docstring)."""

    def enable_cache(self, config) -> None:
        """Refused: see the module docstring.

        Raises:
            ValueError: always, naming the config and pointing at ``enable_acceleration``.
        """
        raise step_cache_refusal(type(config).__name__, self)

    def refuse_step_cache_hooks(self) -> None:
        """Give this model and each of its non-leaf modules a :class:`VARHookRegistry` (called at the end of
        ``__init__``). Leaf layers (Linear, Embedding, norms) keep diffusers' own, created on demand: the forward reads
        their registry for layerwise casting's compute dtype."""
        for module in self.modules():
            if next(module.children(), None) is not None and not hasattr(module, "_diffusers_hook"):
                module._diffusers_hook = VARHookRegistry(module, self)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """``nn.Module.named_modules``, except that a diffusers step-cache ``apply_*`` function walking this model raises
        before it hooks anything (a pattern matching no module would otherwise leave a silent no-op)."""
        caller = _WALKING_APPLY_FUNCTIONS.get(sys._getframe(1).f_code)
        if caller is not None:
            raise step_cache_refusal(caller, self)
        return super().named_modules(memo, prefix, remove_duplicate)
