"""Environment digests: stable, keyed by the image when there is one, cheap, and never importing torch."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

from trackway.receipts.environment import capture_environment


def test_digest_is_stable_across_calls() -> None:
    first, second = capture_environment({}), capture_environment({})
    assert first.sha256 == second.sha256
    assert first.canonical == second.canonical


def test_without_an_image_it_describes_python_and_packages() -> None:
    env = capture_environment({})
    d = env.description
    assert d["kind"] == "python"
    assert d["python"]["version"] == platform.python_version()
    assert d["python"]["executable"] == sys.executable
    assert "pyyaml" in d["distributions"] and "rich" in d["distributions"]
    assert list(d["distributions"]) == sorted(d["distributions"])
    assert d["torch"] is None or set(d["torch"]) == {"version", "cuda"}
    assert d["nvidia_driver"] is None or isinstance(d["nvidia_driver"], str)


def test_the_interpreter_path_is_described_but_not_hashed() -> None:
    env = capture_environment({})
    assert sys.executable.encode() not in env.canonical
    assert json.loads(env.canonical)["distributions"] == env.description["distributions"]


def test_an_image_digest_is_the_identity() -> None:
    plain = capture_environment({})
    image = capture_environment({"TRACKWAY_IMAGE_DIGEST": "sha256:" + "a" * 64})
    other = capture_environment({"TRACKWAY_IMAGE_DIGEST": "sha256:" + "b" * 64})
    assert image.description == {
        "kind": "image",
        "image_digest": "sha256:" + "a" * 64,
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
    }
    assert len({plain.sha256, image.sha256, other.sha256}) == 3


def test_container_image_digest_is_read_when_ours_is_absent() -> None:
    env = capture_environment({"CONTAINER_IMAGE_DIGEST": "sha256:" + "c" * 64})
    assert env.description["image_digest"] == "sha256:" + "c" * 64
    ours = capture_environment({"CONTAINER_IMAGE_DIGEST": "sha256:" + "c" * 64, "TRACKWAY_IMAGE_DIGEST": "sha256:d"})
    assert ours.description["image_digest"] == "sha256:d"


def test_capture_never_imports_torch() -> None:
    # How fast capture is (cold, in a fresh interpreter, and warm) is measured by bench/bench_capture.py:
    # a timing bound here fails on a busy machine without anything being wrong.
    script = (
        "import sys\n"
        "from trackway.receipts.environment import capture_environment\n"
        "capture_environment({})\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
