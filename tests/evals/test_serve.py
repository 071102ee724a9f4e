"""The inference phase's model server (evals/serve.py), run as the supervisor runs it: real processes, a real port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SERVER = textwrap.dedent("""
    import sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "exit":
        sys.exit(4)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if mode == "ok" else 503); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def serve(tmp_path: Path, mode: str, command: list[str], timeout: float = 30) -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "spool").mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "trackway.evals.serve", "--server",
         json.dumps([sys.executable, str(tmp_path / "server.py"), mode, "{port}"]),
         "--health-url", "http://127.0.0.1:{port}/health", "--timeout", str(timeout), "--", *command],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "TRACKWAY_SPOOL_DIR": str(tmp_path / "spool")},
    )
    return done, json.loads((tmp_path / "eval-server.json").read_text())


def test_the_command_runs_once_the_server_answers_with_its_url_and_the_server_is_stopped_after(tmp_path):
    probe = "import os, urllib.request; print(urllib.request.urlopen(os.environ['TRACKWAY_EVAL_SERVER_URL'] + '/x').read())"
    done, facts = serve(tmp_path, "ok", [sys.executable, "-c", probe + "; raise SystemExit(5)"])
    assert done.returncode == 5  # the command's own exit status
    assert "b'ok'" in done.stdout
    assert facts["ready"] is True and facts["command_exit"] == 5
    assert facts["stopped"].startswith("stopped (SIGTERM")
    with pytest.raises(ProcessLookupError):
        os.kill(facts["pid"], 0)  # the server is gone


@pytest.mark.parametrize("mode,said", [("exit", "the model server exited before"), ("unready", "did not answer")])
def test_a_server_that_never_answers_ends_the_attempt_before_the_command_runs(tmp_path, mode, said):
    done, facts = serve(tmp_path, mode, [sys.executable, "-c", "open('ran', 'w')"], timeout=2)
    assert done.returncode == 3
    assert said in done.stderr and facts["ready"] is False
    assert not (tmp_path / "ran").exists()
