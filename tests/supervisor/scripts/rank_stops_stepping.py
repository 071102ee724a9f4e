"""Two ranks as a launcher starts them; in the first attempt rank 1 stops stepping at step 3 while rank 0 goes on.

Run with no argument it is the launcher (torchrun's part): it starts this file once per rank with RANK and
WORLD_SIZE set and waits for both. Rank 1 then hangs as a rank stuck in a data loader does: its process is
alive and its SDK heartbeat thread beats on, only its step stops. Rank 0 steps on for a while, then waits
for rank 1 as a collective would. A second attempt trains both ranks to the end.
"""

import os
import subprocess
import sys
import time

if "RANK" not in os.environ:
    # Heartbeats well inside the test's short stall window (the SDK's default is every 5 s).
    env = {**os.environ, "WORLD_SIZE": "2", "TRACKWAY_HEARTBEAT_S": "0.3"}
    children = [subprocess.Popen([sys.executable, __file__], env={**env, "RANK": str(rank)}) for rank in (0, 1)]
    sys.exit(max(child.wait() for child in children))

import trackway  # noqa: E402

run = trackway.init()
rank = int(os.environ["RANK"])
first = os.environ.get("TRACKWAY_ATTEMPT_NUMBER") == "1"
for step in range(40):
    if first and rank == 1 and step == 4:
        while True:
            time.sleep(1)
    if first and rank == 0 and step == 30:
        while True:  # waiting for rank 1 in the next collective
            time.sleep(1)
    run.log({"loss": 1.0 / (step + 1) + rank}, step=step)
    time.sleep(0.1)
run.finish()
