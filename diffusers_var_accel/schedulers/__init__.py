"""Acceleration schedulers: the base protocol, the identity scheduler, composition, the methods and their registry."""

# the import order is the registry's order of the methods (the order of every list of methods)
from .scheduling_fastvar import FastVARScheduler  # isort: skip
from .scheduling_lazyvar import LazyVARScheduler  # isort: skip
from .scheduling_depthvar import DepthVARScheduler  # isort: skip
from .scheduling_arvar import ARVARScheduler  # isort: skip
from .scheduling_stagevar import StageVARScheduler  # isort: skip
from .composition import ComposedScheduler
from .identity import IdentityScheduler
from .scheduling_var_base import ScalePlan, VARAccelScheduler

__all__ = [
    "ARVARScheduler",
    "ComposedScheduler",
    "DepthVARScheduler",
    "FastVARScheduler",
    "IdentityScheduler",
    "LazyVARScheduler",
    "ScalePlan",
    "StageVARScheduler",
    "VARAccelScheduler",
]
