"""Exceptions a training script raises or meets, each mapped to a termination reason by the SDK's hooks."""

from __future__ import annotations


class BadData(Exception):
    """Raise it when input data cannot be used (schema, decoding, manifest mismatch): the attempt ends as `bad_data`."""


class NonFiniteLoss(FloatingPointError):
    """Raised by `run.log` when a logged loss or gradient norm is NaN or infinite: the attempt ends as `nan_loss`."""

    def __init__(self, key: str, value: float, step: int):
        super().__init__(f"non-finite {key} = {value} at step {step}")
        self.key, self.value, self.step = key, value, step
