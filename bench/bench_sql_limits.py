"""How soon a query that would run for minutes is stopped: `--timeout 1` holds within one more second.

Issue 31's contract: every statement of `trackway sql` and `POST /api/sql` stops within
`--timeout` + 1 s, whatever the query. Measured on a SQLite ledger, where the database cannot
always stop it itself:

- a regular-expression blow-up (`'aaa…!' ~ '(a+)+$'`: 44 s under Python's `re`), run in process;
- one call of a SQLite built-in over megabytes (`instr`: 78 s as one uninterruptible step),
  through the CLI (its process ends itself; the figure is the wall time less a warm `select 1`'s,
  so the interpreter's start-up is not counted) and through the API (its worker is killed).

Target for each: ≤ 2 s (the timeout of 1 s plus one). tests/security/test_sql_boundary.py holds
what the caller gets (the error, the exit code, a server that still answers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import figure  # noqa: E402

from trackway.errors import InputError  # noqa: E402
from trackway.ledger import open_ledger  # noqa: E402
from trackway.ledger.sql.readonly import run_readonly_query  # noqa: E402

TIMEOUT_S = 1.0
BOUND_S = TIMEOUT_S + 1.0
TOKEN = "bench-token-0123456789abcdef"
REGEX = "select 'aaaaaaaaaaaaaaaaaaaaaaaaaaaa!' ~ '(a+)+$'"
ONE_STEP = "select instr(hex(zeroblob(2000000)), hex(zeroblob(1000000)) || '1')"


def regex_seconds(url: str) -> float:
    ledger = open_ledger(url)
    try:
        started = time.perf_counter()
        try:
            run_readonly_query(ledger, REGEX, timeout_s=TIMEOUT_S)
        except InputError:
            pass  # stopped by the limit: what is measured is how soon
        return time.perf_counter() - started
    finally:
        ledger.dispose()


def cli_seconds(env: dict[str, str], *args: str) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trackway", "sql", *args], env=env, capture_output=True, timeout=300)
    return time.perf_counter() - started, done.returncode


def api_seconds(env: dict[str, str], home: Path) -> tuple[float, int]:
    server = subprocess.Popen([sys.executable, "-m", "trackway", "serve", "--port", "0"], cwd=home, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        base = f"http://127.0.0.1:{int(server.stdout.readline())}"
        threading.Thread(target=lambda: server.stdout.read(), daemon=True).start()  # the access log, drained
        post(base, "select 1")  # a worker started and warm: its start-up is not the query's time
        started = time.perf_counter()
        status = post(base, ONE_STEP)
        return time.perf_counter() - started, status
    finally:
        server.terminate()
        server.wait(timeout=30)


def post(base: str, query: str) -> int:
    request = urllib.request.Request(f"{base}/api/sql", data=json.dumps({"query": query, "timeout_s": TIMEOUT_S}).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        url = f"sqlite:///{home / 'ledger.db'}"
        env = {**os.environ, "TRACKWAY_DB": url, "TRACKWAY_HOME": str(home), "TRACKWAY_SERVER_TOKEN": TOKEN,
               "TRACKWAY_BACKGROUND_SUPERVISOR": "0"}
        cli_seconds(env, "select 1")  # the ledger made and migrated
        startup, _ = cli_seconds(env, "select 1")
        stopped, code = cli_seconds(env, "--timeout", f"{TIMEOUT_S:g}", ONE_STEP)
        answered, status = api_seconds(env, home)
        ok = figure("regex blow-up, --timeout 1, in process", regex_seconds(url), target=BOUND_S)
        ok &= figure("one SQLite step, trackway sql --timeout 1 (beyond start-up)", stopped - startup,
                     baseline=startup, baseline_name="warm select 1", target=BOUND_S)
        ok &= figure("one SQLite step, POST /api/sql timeout_s 1", answered, target=BOUND_S)
        if code != 2 or status != 400:
            print(f"expected exit 2 and HTTP 400, got exit {code} and HTTP {status}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
