"""The environment digest: the container image when there is one, else python, packages, torch, CUDA and driver.

Reading every installed distribution's metadata is the slow part (seconds in a large
environment), so a description is cached per environment, keyed by a fingerprint of what that
read depends on: the interpreter, the platform, the NVIDIA driver version the kernel reports, and,
for every entry of the import path, the names of its `*.dist-info` / `*.egg-info` entries and the
modification time of each one's METADATA (PKG-INFO). Installing, removing or upgrading a package
changes one of these, and so the key. Cached descriptions live in
`$TRACKWAY_CACHE_DIR/environments/` (default `$XDG_CACHE_HOME/trackway`, else `~/.cache/trackway`),
one JSON file per fingerprint, owner-only; a file that does not verify is ignored.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from trackway.receipts._nvml import DRIVER_VERSION_FILE, kernel_lists_drivers, nvml_session, text
from trackway.receipts.canonical import canonical_json, sha256_hex

# Checked in order. TRACKWAY_IMAGE_DIGEST is ours (executors set it when they know the image);
# CONTAINER_IMAGE_DIGEST is the name used by pipelines that inject it through the Kubernetes
# downward API or a Slurm/pyxis prolog. Neither Docker nor Kubernetes sets one by default.
IMAGE_DIGEST_VARS = ("TRACKWAY_IMAGE_DIGEST", "CONTAINER_IMAGE_DIGEST")
CACHE_DIR_VAR = "TRACKWAY_CACHE_DIR"
CACHE_FORMAT = 1
CACHE_KEEP = 64  # cached environments kept; the least recently written go first
# A fingerprint whose newest metadata file changed this recently is not cached: a file system with
# a coarse clock could show the same time for a second change made within the same tick.
RACY_SECONDS = 2.0


@dataclass(frozen=True)
class EnvironmentDigest:
    """What the attempt ran in, its canonical JSON bytes, and the sha256 of those bytes."""

    description: dict
    canonical: bytes
    sha256: str
    cached: bool = False  # read from the cache rather than from every distribution's metadata


def capture_environment(
    environ: Mapping[str, str] | None = None,
    *,
    path: Sequence[str] | None = None,
    cache_dir: Path | None = None,
) -> EnvironmentDigest:
    """Describe the software environment and hash it. Never imports torch; never raises for a missing GPU.

    With an image digest (see IMAGE_DIGEST_VARS) the image is the identity: the description is
    the digest plus the python version. Otherwise it lists the python version, the platform,
    every distribution installed on `path` (default `sys.path`), torch with its CUDA build, and
    the NVIDIA driver, from the cache when this environment was described before (see above;
    `cache_dir` overrides where).

    `python.executable` is in the description but not in the hash: the same environment
    installed at two paths (two venvs, two home directories) is the same environment, and a
    hash that changed per machine could not answer "did these attempts run the same software?".
    """
    environ = os.environ if environ is None else environ
    image = _image_digest(environ)
    python = {"version": platform.python_version(), "implementation": platform.python_implementation()}
    if image is not None:
        return _digest({"kind": "image", "image_digest": image, "python": python})
    entries = [entry or os.getcwd() for entry in (sys.path if path is None else path)]
    cache = _Cache(cache_dir if cache_dir is not None else default_cache_dir())
    key, newest = _fingerprint(entries)
    found = cache.get(key)
    if found is not None:
        return found
    description = {
        "kind": "python",
        "python": {**python, "executable": sys.executable},
        "platform": _platform(),
        "distributions": _distributions(entries),
        "torch": _torch(entries),
        "nvidia_driver": _nvidia_driver(),
    }
    digest = _digest(description)
    # Cached only when nothing changed while it was read, and not so recently that a clock could hide a change.
    if _fingerprint(entries) == (key, newest) and newest < time.time_ns() - RACY_SECONDS * 1e9:
        cache.put(key, digest)
    return digest


def _digest(description: dict[str, Any], cached: bool = False) -> EnvironmentDigest:
    hashed = {**description, "python": {k: v for k, v in description["python"].items() if k != "executable"}}
    canonical = canonical_json(hashed)
    return EnvironmentDigest(description=description, canonical=canonical, sha256=sha256_hex(canonical), cached=cached)


def default_cache_dir() -> Path:
    """$TRACKWAY_CACHE_DIR, else $XDG_CACHE_HOME/trackway, else ~/.cache/trackway."""
    chosen = os.environ.get(CACHE_DIR_VAR)
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "trackway"


def _fingerprint(entries: list[str]) -> tuple[str, int]:
    """The cache key of this environment, and the newest modification time (ns) among the files it covers."""
    digest = hashlib.sha256()
    for part in (sys.executable, sys.version, json.dumps(_platform(), sort_keys=True), _driver_file_text()):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    newest = 0
    for entry in entries:
        digest.update(b"\1" + entry.encode("utf-8", "surrogateescape") + b"\0")
        try:
            children = sorted((child.name, child.path, child.is_dir()) for child in os.scandir(entry)
                              if child.name.endswith((".dist-info", ".egg-info")))
            # A directory's own time changes with every file made in it (a script's outputs): not read.
            # An unpacked egg holds its metadata in EGG-INFO.
            own = os.path.join(entry, "EGG-INFO", "PKG-INFO") if entry.endswith(".egg") else None
        except OSError:
            children, own = [], entry  # a zipped egg or wheel, or nothing: its own stat says enough
        if own is not None:
            try:
                info = os.stat(own)
                digest.update(f"{info.st_mtime_ns}:{info.st_size}:{info.st_ino}".encode())
                newest = max(newest, info.st_mtime_ns)
            except OSError:
                digest.update(b"-")
        for name, child_path, is_dir in children:
            meta = child_path  # an .egg-info file is the metadata itself
            if is_dir:
                meta = os.path.join(child_path, "METADATA" if name.endswith(".dist-info") else "PKG-INFO")
            try:
                info = os.stat(meta)
                stamp = f"{info.st_mtime_ns}:{info.st_size}"
                newest = max(newest, info.st_mtime_ns)
            except OSError:
                stamp = "-"
            digest.update(f"{name}\0{stamp}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest(), newest


def _driver_file_text() -> str:
    try:
        return DRIVER_VERSION_FILE.read_text().strip()
    except OSError:
        return ""


# What this process read or wrote already, by (cache directory, fingerprint).
_MEMORY: dict[tuple[str, str], EnvironmentDigest] = {}


class _Cache:
    """Environment descriptions by fingerprint: one owner-only JSON file each, plus this process's memory."""

    def __init__(self, directory: Path):
        self.directory = directory / "environments"

    def get(self, key: str) -> EnvironmentDigest | None:
        found = _MEMORY.get((str(self.directory), key))
        if found is None:
            found = self._read(key)
            if found is None:
                return None
            _MEMORY[(str(self.directory), key)] = found
        if not kernel_lists_drivers():
            # Nothing the key reads would change with the driver here: ask NVML now.
            driver = _nvidia_driver()
            if driver != found.description.get("nvidia_driver"):
                return _digest({**found.description, "nvidia_driver": driver}, cached=True)
        return found

    def _read(self, key: str) -> EnvironmentDigest | None:
        try:
            saved = json.loads((self.directory / f"{key}.json").read_bytes())
            if saved["format"] != CACHE_FORMAT or saved["fingerprint"] != key:
                return None
            found = _digest(saved["description"], cached=True)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if found.sha256 != saved.get("sha256") or found.description["python"].get("executable") != sys.executable:
            return None
        return found

    def put(self, key: str, digest: EnvironmentDigest) -> None:
        """Save `digest` under `key`; a cache that cannot be written only costs the next capture its time."""
        payload = json.dumps({"format": CACHE_FORMAT, "fingerprint": key, "description": digest.description,
                              "sha256": digest.sha256}).encode()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            target = self.directory / f"{key}.json"
            tmp = self.directory / f".{key}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
            os.replace(tmp, target)
            self._prune()
        except OSError:
            return
        _MEMORY[(str(self.directory), key)] = EnvironmentDigest(digest.description, digest.canonical,
                                                                     digest.sha256, cached=True)

    def _prune(self) -> None:
        entries = []
        for child in os.scandir(self.directory):
            if child.name.endswith(".json"):
                try:
                    entries.append((child.stat().st_mtime_ns, child.path))
                except OSError:
                    continue
        for _, stale in sorted(entries)[:-CACHE_KEEP]:
            try:
                os.unlink(stale)
            except OSError:
                pass


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


def _distributions(entries: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=entries):
        meta = dist.metadata  # parsed once for both fields
        name = meta["Name"]
        if name:
            # Where one name is installed twice, the first on sys.path is the one that imports.
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), meta["Version"])
    return dict(sorted(found.items()))


def _torch(entries: list[str]) -> dict[str, str | None] | None:
    dist = next(iter(metadata.distributions(name="torch", path=entries)), None)
    if dist is None:
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
