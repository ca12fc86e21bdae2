"""Acceleration schedulers: the base protocol, the identity scheduler, composition and the methods."""

from .scheduling_arvar import ARVARScheduler
from .scheduling_depthvar import DepthVARScheduler
from .scheduling_fastvar import FastVARScheduler
from .scheduling_lazyvar import LazyVARScheduler
from .scheduling_var_base import ComposedScheduler, IdentityScheduler, ScalePlan, VARAccelScheduler

__all__ = ["ARVARScheduler", "ComposedScheduler", "DepthVARScheduler", "FastVARScheduler", "IdentityScheduler", "LazyVARScheduler", "ScalePlan", "VARAccelScheduler"]
