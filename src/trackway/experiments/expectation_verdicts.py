"""A run's acceptance criteria as last judged, read back for people: the verdict's words and lines.

Read by `show`, `explain`, `evals`, `compare` and the API on every call, so it imports nothing but
json: judging them (experiments/expectations.py) needs SQLAlchemy, reading the verdict does not.
"""

from __future__ import annotations

import json
from typing import Any

MET, NOT_YET, NOT_MET, NOT_KNOWN = "met", "not yet", "not met", "not known"
SETTLED = (MET, NOT_MET, NOT_KNOWN)


def verdict_of(row: Any) -> list[dict[str, Any]]:
    """The criteria's verdict as last judged (runs.expect_verdict), or each as `not yet` before the first judgement."""
    if row.get("expect_verdict"):
        return json.loads(row["expect_verdict"])["criteria"]
    texts = json.loads(row["expect"]) if row.get("expect") else []
    return [{"criterion": text, "state": NOT_YET, "why": "not judged yet", "values": {}, "step": None,
             "settled_at": None, "checkpoints": []} for text in texts]


def lines(row: Any) -> list[str]:
    """One line per criterion for a person: `met: eval.pass@1 > 0.05 (met at step 200: 0.07 > 0.05)`."""
    return [f"{c['state']}: {c['criterion']} ({c['why']})" for c in verdict_of(row)]
