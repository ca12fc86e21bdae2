"""diffusers' step caches (``transformer.enable_cache(config)``) on the VAR transformers: refused, saying why.

FirstBlockCache, MagCache, TaylorSeer, PyramidAttentionBroadcast, FasterCache, SeaCache and TextKVCache reuse a
block's (or the model's) output from one denoising step at the next, when the input has barely changed. A next-scale
loop has no such steps: each pass runs a new, larger scale whose tokens were never computed before, and the reuse
that does hold across scales is what the acceleration methods do (LazyVAR's kept tokens, FastVAR's cached scale,
DepthVAR's layer deltas). So ``enable_cache`` raises at once, naming the config, instead of installing hooks that
crash or do nothing at generation.
"""

from __future__ import annotations

from diffusers.models.cache_utils import CacheMixin

STEP_CACHE_REFUSAL = (
    "{config} caches across the denoising steps of a diffusion loop, and {model}'s next-scale loop has none (each "
    "pass computes a new scale's tokens): use pipe.enable_acceleration(...) (fastvar, lazyvar, depthvar, arvar, "
    "stagevar), which reuse what holds across scales"
)


class VARStepCacheMixin(CacheMixin):
    """diffusers' ``CacheMixin`` API, whose every cache is refused with :data:`STEP_CACHE_REFUSAL`."""

    def enable_cache(self, config) -> None:
        """Refused: see the module docstring.

        Raises:
            ValueError: always, naming the config and pointing at ``enable_acceleration``.
        """
        raise ValueError(STEP_CACHE_REFUSAL.format(config=type(config).__name__, model=type(self).__name__))
