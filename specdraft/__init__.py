"""specdraft: speculative decoding where every way of drafting tokens is a plug-in.

The core (this package) never imports `drafters`: a drafter is anything that implements
`specdraft.protocol.Drafter`.
"""

from specdraft.decode import GenerationResult, SpeculativeDecoder
from specdraft.protocol import Draft, DraftContext, Drafter
from specdraft.sampling import SamplingConfig, warp
from specdraft.stats import GenerationStats
from specdraft.target import TargetModel

__all__ = [
    "Draft",
    "DraftContext",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "SamplingConfig",
    "SpeculativeDecoder",
    "TargetModel",
    "warp",
]
