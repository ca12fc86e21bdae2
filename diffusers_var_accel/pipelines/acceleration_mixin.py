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
            **overrides: settings of [`FastVARScheduler`] replacing the preset's (e.g. ``skip_last_scales=False``,
                ``prune_ratios=(0.5, 0.6)``); an unknown name raises a ``ValueError``.

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
            **overrides: settings of [`LazyVARScheduler`] replacing the preset's (e.g. ``keep_ratios=(0.4, 0.2, 0.1,
                0.02)``, ``parallel_decoding=False``); an unknown name raises a ``ValueError``.

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

    def _enable_preset(self, scheduler_cls, overrides) -> VARAccelScheduler:
        scheduler = scheduler_cls.from_preset(self.model_family, **overrides)
        self.enable_acceleration(scheduler)
        return scheduler
