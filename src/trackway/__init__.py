"""trackway: training runs that leave tracks. This module exports the training-side SDK's names only."""

from trackway.sdk.exceptions import BadData, NonFiniteLoss, SpoolPointsLost
from trackway.sdk.run import EXIT_PREEMPTED, Run, init

__version__ = "0.1.0"

__all__ = ["BadData", "EXIT_PREEMPTED", "NonFiniteLoss", "Run", "SpoolPointsLost", "__version__", "init"]
