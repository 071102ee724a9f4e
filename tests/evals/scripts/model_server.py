"""A small HTTP inference server around the test model (a `neutral.py` checkpoint: its step is its skill).

`python model_server.py --port PORT`: GET /health answers once the checkpoint is loaded; POST
/generate with {"task_id", "answer", "sample", "seed"} answers {"output"}: right with a probability
that grows with the checkpoint's step, decided by a hash (the same request, the same answer).
"""

import argparse
import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()
step = int((Path(os.environ["TRACKWAY_CHECKPOINT"]) / "counter.txt").read_text())
skill = min(1.0, step / 50.0)


class Handler(BaseHTTPRequestHandler):
    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        self._answer(200 if self.path == "/health" else 404, {"step": step})

    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = f"{request['task_id']}/{request['sample']}/{request['seed']}"
        draw = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32
        self._answer(200, {"output": request["answer"] if draw < skill else "??"})

    def log_message(self, *args):
        pass


print(f"model server: step {step} on port {args.port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
