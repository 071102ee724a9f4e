"""The record of one placement: the resource chosen, its QoS tier, why, and every candidate passed over.

`resources/selection.py` makes it; the attempt keeps it as JSON; `show`, `explain` and `submit` print
it back. It stands alone so that printing a placement imports nothing that chooses one (availability
probes, the GPU catalog): `show` pays for one line, not for the selection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Selection:
    """The resource chosen, its QoS tier, why, and every candidate passed over with its reason."""

    requested: str
    resource: str
    qos: str | None
    reason: str
    skipped: tuple[tuple[str, str], ...] = field(default=())
    # A run in pieces (--in-pieces): the most hours each attempt runs here; None: the run's own time limit.
    piece_hours: float | None = None

    def text(self) -> str:
        chosen = f"{self.resource}/{self.qos}" if self.qos else self.resource
        parts = [f"chose {chosen}: {self.reason}", *(f"skipped {name}: {why}" for name, why in self.skipped)]
        return "; ".join(parts)

    def to_json(self) -> str:
        return json.dumps({
            "requested": self.requested, "chosen": self.resource, "qos": self.qos, "reason": self.reason,
            "skipped": [{"resource": name, "reason": why} for name, why in self.skipped],
            **({"piece_hours": self.piece_hours} if self.piece_hours is not None else {}),
        })

    @classmethod
    def from_json(cls, text: str | None) -> Selection | None:
        if not text:
            return None
        data = json.loads(text)
        return cls(data["requested"], data["chosen"], data.get("qos"), data["reason"],
                   tuple((item["resource"], item["reason"]) for item in data.get("skipped", [])),
                   data.get("piece_hours"))
