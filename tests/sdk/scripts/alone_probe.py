"""A script run alone (`trackway.init()` with no attempt around it): `python alone_probe.py STEPS`.

Prints one JSON line: the run id, whether this process ever imported SQLAlchemy, and how many
package METADATA files it opened (an audit hook counts them) while `init()` ran.
"""

import json
import sys

opened = []
counting = [False]


def _audit(event, args):
    if counting[0] and event == "open" and str(args[0]).endswith(("METADATA", "PKG-INFO")):
        opened.append(args[0])


sys.addaudithook(_audit)

import trackway  # noqa: E402

steps = int(sys.argv[1])
counting[0] = True
run = trackway.init(config={"steps": steps}, name=f"alone-{steps}", install_hooks=False)
counting[0] = False
for step in range(steps):
    run.log({"loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
run.finish()
print(json.dumps({"run_id": run.run_id, "sqlalchemy": "sqlalchemy" in sys.modules, "metadata_opened": len(opened)}))
