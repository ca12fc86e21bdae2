"""The contract of the next-scale loop: plans, routes, per-call state, forward context, KV cache, CFG rows, the
executor and the loop itself. Models import only from here; schedulers and pipelines sit above; bench and CLI on top.
"""

from .cache import ScaleKVCache
from .context import PassRecords, VARForwardContext
from .executor import execute_blocks, run_sublayer
from .loop import identity_plans, run_next_scale_loop
from .plan import (
    PASS_THROUGH,
    EarlierScale,
    LayerProxy,
    ModelInfo,
    PassRoutes,
    PassThrough,
    RecordRequest,
    ScalePlan,
    TokenRoute,
    resolve_scale_index,
    validate_plans,
)
from .executor import match_rows
from .rows import RowLayout
from .state import NextScaleState, ScaleModelFamily, ScalePrediction, ScheduleTables

__all__ = [
    "ScaleKVCache",
    "PassRecords",
    "VARForwardContext",
    "execute_blocks",
    "run_sublayer",
    "identity_plans",
    "run_next_scale_loop",
    "PASS_THROUGH",
    "EarlierScale",
    "LayerProxy",
    "ModelInfo",
    "PassRoutes",
    "PassThrough",
    "RecordRequest",
    "ScalePlan",
    "TokenRoute",
    "resolve_scale_index",
    "validate_plans",
    "RowLayout",
    "match_rows",
    "NextScaleState",
    "ScaleModelFamily",
    "ScalePrediction",
    "ScheduleTables",
]
