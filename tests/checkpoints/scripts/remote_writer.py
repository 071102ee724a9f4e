"""A remote-store writer to kill or race: uploads (or deletes) one step, as the SDK's uploader thread would.

    python remote_writer.py upload LOCAL_ROOT STEP URL            upload a committed local checkpoint
    python remote_writer.py race LOCAL_ROOT STEP URL READY GO     stage, touch READY, wait for GO, commit
    python remote_writer.py delete STEP URL                       delete a committed checkpoint

Prints one JSON line: {"outcome": "committed" | "lost" | "deleted", "token": the committed token}.
Credentials and endpoint come from the environment (AWS_*), as in an attempt. Kill it anywhere:
SIGKILL from outside, or TRACKWAY_CHECKPOINT_CRASH_AT=<point> (object_store.CRASH_POINTS).
"""

import json
import sys
import time
from pathlib import Path

from trackway.checkpoints.object_store import RemoteCheckpointStore, UploadLost
from trackway.checkpoints.store import CheckpointStore

command, *args = sys.argv[1:]
if command == "delete":
    step, url = int(args[0]), args[1]
    RemoteCheckpointStore(url).delete(step)
    print(json.dumps({"outcome": "deleted", "token": None}), flush=True)
    sys.exit(0)

root, step, url = Path(args[0]), int(args[1]), args[2]
local = CheckpointStore(root).get(step)
store = RemoteCheckpointStore(url)
try:
    if command == "upload":
        remote = store.upload(local)
    else:
        ready, go = Path(args[3]), Path(args[4])
        staged = store.stage(local)
        ready.touch()
        while not go.exists():
            time.sleep(0.01)
        remote = staged.commit()
except UploadLost as exc:
    print(json.dumps({"outcome": "lost", "token": exc.winner.token}), flush=True)
    sys.exit(0)
print(json.dumps({"outcome": "committed", "token": remote.token}), flush=True)
