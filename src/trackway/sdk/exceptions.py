"""Exceptions a training script raises or meets, each mapped to a termination reason by the SDK's hooks."""

from __future__ import annotations


class BadData(Exception):
    """Raise it when input data cannot be used (schema, decoding, manifest mismatch): the attempt ends as `bad_data`."""


class NonFiniteLoss(FloatingPointError):
    """A logged loss or gradient norm was NaN or infinite: the attempt ends as `nan_loss`.

    Raised by the first `run.log` after the writer thread met it, or first by a checkpoint save,
    `finish()` or `exit_preempted()`, which check everything logged before them.
    """

    def __init__(self, key: str, value: float, step: int):
        super().__init__(f"non-finite {key} = {value} at step {step}")
        self.key, self.value, self.step = key, value, step


class SpoolPointsLost(RuntimeError):
    """Raised by `run.finish()` when metric points could be written neither to the spool nor to a fallback."""

    def __init__(self, points: int, spool_dir: str):
        super().__init__(
            f"{points} metric points were lost: the spool at {spool_dir} and every fallback directory refused "
            "them (see the lines above for the error); the run's curves have holes"
        )
        self.points, self.spool_dir = points, spool_dir
