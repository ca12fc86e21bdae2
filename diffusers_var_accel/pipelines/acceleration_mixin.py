"""Attaching acceleration schedulers to a pipeline: per instance, reversible, or for one call."""

from __future__ import annotations

from typing import Optional

from ..schedulers.scheduling_var_base import VARAccelScheduler


class VARAccelerationMixin:
    """``enable_acceleration`` / ``disable_acceleration`` and the per-method shortcuts of the VAR pipelines.

    The scheduler is the optional pipeline component ``acceleration``: ``save_pretrained`` stores it in
    ``acceleration/acceleration_config.json`` and ``from_pretrained`` brings it back. Nothing on the model changes when
    a scheduler is attached: the loop consults it at every call, so disabling is exact.
    """

    #: The model family of the pipeline (``"infinity"``, ``"hart"``): selects presets and is checked on attach.
    model_family: str = ""

    def enable_acceleration(self, scheduler: VARAccelScheduler) -> None:
        """Accelerate every following call with ``scheduler`` (replacing any attached one).

        Raises:
            ValueError: ``scheduler`` is not a ``VARAccelScheduler`` or was built for another model family.
        """
        if not isinstance(scheduler, VARAccelScheduler):
            raise ValueError(f"acceleration must be a VARAccelScheduler, got {type(scheduler).__name__}")
        scheduler.check_model_family(self.model_family)
        self.register_modules(acceleration=scheduler)

    def disable_acceleration(self) -> None:
        """Detach the acceleration scheduler: calls run the baseline again, bit for bit."""
        self.register_modules(acceleration=None)

    def _acceleration_for_call(self, acceleration: Optional[VARAccelScheduler]) -> Optional[VARAccelScheduler]:
        if acceleration is None:
            return getattr(self, "acceleration", None)
        if not isinstance(acceleration, VARAccelScheduler):
            raise ValueError(f"acceleration must be a VARAccelScheduler, got {type(acceleration).__name__}")
        acceleration.check_model_family(self.model_family)
        return acceleration

    def enable_fastvar(self, **overrides) -> VARAccelScheduler:
        r"""Accelerate every following call with FastVAR (arXiv:2503.23367), in its published setting for this model.

        Pivotal tokens of the late scales are computed, the others restored from a cached earlier scale, and (Infinity)
        the last two scales are skipped. See [`FastVARScheduler`] for the settings.

        Args:
            **overrides (`Any`): settings of [`FastVARScheduler`] replacing the preset's (e.g.
                ``skip_last_scales=False``, ``prune_ratios=(0.5, 0.6)``); an unknown name raises a ``ValueError``.

        Returns:
            [`FastVARScheduler`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Examples:
            ```py
            >>> import torch
            >>> from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

            >>> pipe = build_tiny_infinity_pipeline(depth=8)
            >>> fastvar = pipe.enable_fastvar(pruned_layers=None)  # the tiny model has only 8 layers
            >>> image = pipe("a red fox in the snow", height=512, width=512, generator=torch.Generator().manual_seed(0)).images[0]
            >>> pipe.disable_acceleration()
            ```
        """
        from ..schedulers.scheduling_fastvar import FastVARScheduler

        return self._enable_preset(FastVARScheduler, overrides)

    def enable_lazyvar(self, **overrides) -> VARAccelScheduler:
        r"""Accelerate every following call with LazyVAR (CVPR 2026), in its published setting for this model.

        The last four scales are decoded in one pass, each computing only the tokens with the largest update index
        (20%, 10%, 5%, 1%); the other positions get a zero residual. See [`LazyVARScheduler`] for the settings.

        Args:
            **overrides (`Any`): settings of [`LazyVARScheduler`] replacing the preset's (e.g.
                ``keep_ratios=(0.4, 0.2, 0.1, 0.02)``, ``parallel_decoding=False``); an unknown name raises a
                ``ValueError``.

        Returns:
            [`LazyVARScheduler`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Examples:
            ```py
            >>> import torch
            >>> from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

            >>> pipe = build_tiny_infinity_pipeline(seed=0)
            >>> pipe.enable_lazyvar()
            >>> image = pipe("a red fox in the snow", height=512, width=512, generator=torch.Generator().manual_seed(0)).images[0]
            >>> pipe.disable_acceleration()
            ```
        """
        from ..schedulers.scheduling_lazyvar import LazyVARScheduler

        return self._enable_preset(LazyVARScheduler, overrides)

    def enable_depthvar(self, **overrides) -> VARAccelScheduler:
        r"""Accelerate every following call with DepthVAR (CVPR 2026 Findings), in its published setting for this model.

        Every token of the late scales runs a number of layers set by its depth score (spread over the network by bit
        reversal); skipped layers take the previous scale's upsampled layer delta, and the codes are weighted by the
        score. The preset is the paper's R = 9 point; ``reference_scale=7`` gives its R = 7 point. See
        [`DepthVARScheduler`] for the settings.

        Args:
            **overrides (`Any`): settings of [`DepthVARScheduler`] replacing the preset's (e.g. ``reference_scale=7``,
                ``rotation_step=0``); an unknown name raises a ``ValueError``.

        Returns:
            [`DepthVARScheduler`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Examples:
            ```py
            >>> import torch
            >>> from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

            >>> pipe = build_tiny_infinity_pipeline(depth=8)
            >>> pipe.enable_depthvar(reference_scale=7)
            >>> image = pipe("a red fox in the snow", height=512, width=512, generator=torch.Generator().manual_seed(0)).images[0]
            >>> pipe.disable_acceleration()
            ```
        """
        from ..schedulers.scheduling_depthvar import DepthVARScheduler

        return self._enable_preset(DepthVARScheduler, overrides)

    def enable_arvar(self, **overrides) -> VARAccelScheduler:
        r"""Accelerate every following call with ARVAR (ECCV 2026), in its published setting for this model.

        Branch halving at the second-to-last scale (only the conditional CFG rows run); attention-retrospect pruning at
        the last scale: every layer computes the 25 % of tokens that received the most self-attention three scales
        earlier and overwrites an upsampled copy of its output from two scales earlier. Needs CFG (a guidance scale
        != 1) while branch halving is on. See [`ARVARScheduler`] for the settings.

        Args:
            **overrides (`Any`): settings of [`ARVARScheduler`] replacing the preset's (e.g. ``prune_ratios=(0.5,)``,
                ``branch_halving_scales=()``); an unknown name raises a ``ValueError``.

        Returns:
            [`ARVARScheduler`]: the attached scheduler (``disable_acceleration()`` detaches it).

        Examples:
            ```py
            >>> import torch
            >>> from diffusers_var_accel.utils.tiny import build_tiny_infinity_pipeline

            >>> pipe = build_tiny_infinity_pipeline(seed=0)
            >>> pipe.enable_arvar()
            >>> image = pipe("a red fox in the snow", height=512, width=512, generator=torch.Generator().manual_seed(0)).images[0]
            >>> pipe.disable_acceleration()
            ```
        """
        from ..schedulers.scheduling_arvar import ARVARScheduler

        return self._enable_preset(ARVARScheduler, overrides)

    def _enable_preset(self, scheduler_cls, overrides) -> VARAccelScheduler:
        scheduler = scheduler_cls.from_preset(self.model_family, **overrides)
        self.enable_acceleration(scheduler)
        return scheduler
