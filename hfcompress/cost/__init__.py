"""Cost model of a training step's communication at cluster scale: bytes per
node link by the algorithm the backend runs, time on the links, codec, compute and overlap.
Pure arithmetic (no processes): ``auto`` prices its candidates with the same collectives
(``collectives.py``), the planner (``hfcompress plan``) prices presets on any layout."""

from .cluster import ClusterLayout
from .links import ClusterLinks
from .step_model import (ENGINES, CollectiveCost, StepCost, compute_from_baseline,
                         price_step)

__all__ = ["ClusterLayout", "ClusterLinks", "CollectiveCost", "StepCost", "ENGINES",
           "compute_from_baseline", "price_step"]
