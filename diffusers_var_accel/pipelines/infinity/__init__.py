from .pipeline_infinity import InfinityPipeline, InfinityScaleFamily, sample_bits

__all__ = ["InfinityPipeline", "InfinityScaleFamily", "sample_bits"]
