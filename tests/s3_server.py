"""A real S3 for the tests (and bench/): moto's standalone server on a free loopback port, started once.

`s3_server` is a session fixture (one server per xdist worker); tests/conftest.py registers it for
every test. `running_moto()` is the same server as a context manager, for the benchmarks.

    def test_upload(s3_server):
        bucket = s3_server.bucket("ckpt")          # a fresh, empty bucket: "ckpt-<random>"
        store = RemoteCheckpointStore(f"s3://{bucket}/run", s3_server.storage_options)
        ...
        env = {**os.environ, **s3_server.env}      # for a subprocess: AWS_* pointing at the server
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MOTO_SERVER = Path(sys.executable).parent / "moto_server"
KEY, SECRET, REGION = "trackway-test-key", "trackway-test-secret", "us-east-1"


@dataclass
class S3Server:
    """A running moto server: where it answers, the environment and fsspec options that reach it."""

    endpoint: str
    env: dict[str, str] = field(init=False)
    storage_options: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                    "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": REGION}
        self.storage_options = {"key": KEY, "secret": SECRET,
                                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION}}

    def bucket(self, name: str = "trackway") -> str:
        """Create a new, empty bucket whose name starts with `name`; return its name."""
        bucket = f"{name}-{uuid.uuid4().hex[:10]}".lower()
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def client(self) -> Any:
        """A boto3 S3 client on this server (to look at or tamper with objects behind trackway's back)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY,
                            aws_secret_access_key=SECRET, region_name=REGION)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, whatever it said
    except OSError:
        return False


@contextmanager
def running_moto(timeout_s: float = 30.0, host: str = "127.0.0.1") -> Iterator[S3Server]:
    """Start `moto_server` (next to this interpreter) on a free port, wait until it answers, stop it after.

    `host`: the address it listens on; another than loopback for clients in network namespaces.
    """
    if not MOTO_SERVER.exists():
        raise RuntimeError(f"{MOTO_SERVER} is missing: pip install 'moto[server]' (the dev extra has it)")
    for _ in range(3):  # the free port may be taken between the probe and the server's bind
        port = _free_port()
        endpoint = f"http://{host}:{port}"
        # A file, not a pipe: the server logs every request to stderr, and a pipe nobody reads fills
        # up and stops it (mid-response, holding the logging lock every other request then waits on).
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([str(MOTO_SERVER), "-H", host, "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline and not _answers(endpoint):
            time.sleep(0.1)
        if proc.poll() is None and _answers(endpoint):
            break
        proc.kill()
        proc.wait()
        log.seek(0)
        last = (log.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        log.close()
    else:
        raise RuntimeError(f"moto_server did not come up: {last}")
    try:
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server for the session (per xdist worker); buckets from `.bucket()` keep tests apart."""
    with running_moto() as server:
        yield server
