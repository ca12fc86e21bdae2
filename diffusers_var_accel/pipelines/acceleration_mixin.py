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

    def _enable_preset(self, scheduler_cls, overrides) -> VARAccelScheduler:
        scheduler = scheduler_cls.from_preset(self.model_family, **overrides)
        self.enable_acceleration(scheduler)
        return scheduler
