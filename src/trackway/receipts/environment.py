"""The environment digest: the container image when there is one, else python, packages, torch, CUDA and driver."""

from __future__ import annotations

import ast
import os
import platform
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from trackway.receipts._nvml import nvml_session, text
from trackway.receipts.canonical import canonical_json, sha256_hex

# Checked in order. TRACKWAY_IMAGE_DIGEST is ours (executors set it when they know the image);
# CONTAINER_IMAGE_DIGEST is the name used by pipelines that inject it through the Kubernetes
# downward API or a Slurm/pyxis prolog. Neither Docker nor Kubernetes sets one by default.
IMAGE_DIGEST_VARS = ("TRACKWAY_IMAGE_DIGEST", "CONTAINER_IMAGE_DIGEST")


@dataclass(frozen=True)
class EnvironmentDigest:
    """What the attempt ran in, its canonical JSON bytes, and the sha256 of those bytes."""

    description: dict
    canonical: bytes
    sha256: str


def capture_environment(environ: Mapping[str, str] | None = None) -> EnvironmentDigest:
    """Describe the software environment and hash it. Never imports torch; never raises for a missing GPU.

    With an image digest (see IMAGE_DIGEST_VARS) the image is the identity: the description is
    the digest plus the python version. Otherwise it lists the python version, the platform,
    every installed distribution, torch with its CUDA build, and the NVIDIA driver.

    `python.executable` is in the description but not in the hash: the same environment
    installed at two paths (two venvs, two home directories) is the same environment, and a
    hash that changed per machine could not answer "did these attempts run the same software?".
    """
    environ = os.environ if environ is None else environ
    image = _image_digest(environ)
    python = {"version": platform.python_version(), "implementation": platform.python_implementation()}
    if image is not None:
        description: dict[str, Any] = {"kind": "image", "image_digest": image, "python": python}
        hashed = description
    else:
        description = {
            "kind": "python",
            "python": {**python, "executable": sys.executable},
            "platform": _platform(),
            "distributions": _distributions(),
            "torch": _torch(),
            "nvidia_driver": _nvidia_driver(),
        }
        hashed = {**description, "python": python}
    canonical = canonical_json(hashed)
    return EnvironmentDigest(description=description, canonical=canonical, sha256=sha256_hex(canonical))


def _image_digest(environ: Mapping[str, str]) -> str | None:
    for name in IMAGE_DIGEST_VARS:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def _platform() -> dict[str, str]:
    # The OS and CPU architecture, not the kernel release: nodes of one cluster differ in
    # kernel patch level without running different software.
    system = platform.system()
    libc = os.confstr("CS_GNU_LIBC_VERSION") if system == "Linux" and hasattr(os, "confstr") else None
    return {"system": system, "machine": platform.machine(), "libc": libc or ""}


def _distributions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            # Where one name is installed twice, the first on sys.path is the one that imports.
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
    return dict(sorted(found.items()))


def _torch() -> dict[str, str | None] | None:
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return None
    return {"version": dist.version, "cuda": _torch_cuda(dist)}


def _torch_cuda(dist: metadata.Distribution) -> str | None:
    """The `cuda = ...` line of torch/version.py, read as text: importing torch costs seconds."""
    try:
        source = dist.locate_file("torch/version.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets):
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return None


def _nvidia_driver() -> str | None:
    with nvml_session() as lib:
        if lib is None:
            return None
        try:
            return text(lib.nvmlSystemGetDriverVersion())
        except lib.NVMLError:
            return None
