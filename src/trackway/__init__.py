"""trackway: training runs that leave tracks. This module exports the training-side SDK's names only."""

__version__ = "0.1.0"

__all__ = ["__version__"]
