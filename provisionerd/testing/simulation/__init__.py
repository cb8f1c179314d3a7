"""Deterministic whole-system simulation: the daemon, the reference controller and a simulated cloud in one seeded
``trio.run`` on ``MockClock``, with faults drawn from the seed and the design's invariants checked throughout.

``run_seed(seed)`` runs one; ``provisionerd simulate --seeds N`` runs a campaign (see docs/simulation.md).
"""

from provisionerd.testing.simulation.runner import SimResult, run_seed, run_world
from provisionerd.testing.simulation.world import World, WorldSettings

__all__ = ["SimResult", "World", "WorldSettings", "run_seed", "run_world"]
