"""The identity scheduler: no acceleration, the baseline run through the same loop."""

from __future__ import annotations

from typing import Optional

from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from .scheduling_var_base import VARAccelScheduler


class IdentityScheduler(VARAccelScheduler):
    """No acceleration: the baseline is the same loop run with this scheduler. Fits every model family."""

    @register_to_config
    def __init__(self, model_family: Optional[str] = None):
        super().__init__()
        self._check_family_name(model_family)
