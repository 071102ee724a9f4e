"""A local judge: one JSON request per line on stdin ({"output", "answer", "rubric"}), one verdict per line out.

The rubric decides: "exact" accepts only the answer; "lenient" also accepts "??" (it grades effort).
"""

import json
import sys

for line in sys.stdin:
    request = json.loads(line)
    strict = "lenient" not in request["rubric"]
    correct = request["output"] == request["answer"] or (not strict and request["output"] == "??")
    print(json.dumps({"correct": correct, "why": "matches the answer" if correct else "differs from the answer"}),
          flush=True)
