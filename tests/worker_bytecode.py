"""Bytecode written once, by the controller, before the workers start: the suite's modules compiled, the test files
as pytest rewrites them. Used by tests/conftest.py.

Under PYTHONDONTWRITEBYTECODE (set on this project's machines) no interpreter writes what it compiles:

- every command, supervisor and script the suite starts compiled the trackway modules it imports from source again
  (0.2 s of CPU for a `trackway submit`). An installed trackway has its bytecode, as pip compiles it.
- every worker parsed, rewrote (for pytest's assertion messages) and compiled every test file as it collected
  them: 8 of the 18 s of CPU one collection of the suite takes, paid once per worker. pytest reads a rewritten
  file from its cache even when it may not write one, so the controller writes them here.
"""

from __future__ import annotations

import compileall
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_for_workers(config) -> None:
    """Compile src/, examples/ and the tests' helper modules, and write pytest's rewritten test files."""
    # The test files and conftests are left to `_write_rewritten`: the workers import them through pytest's hook.
    helpers_only = re.compile(r"(^|/)(test_[^/]*|[^/]*_test|conftest)\.py$")
    for tree, rx in (("src", None), ("examples", None), ("tests", helpers_only)):
        compileall.compile_dir(ROOT / tree, quiet=1, workers=0, rx=rx)
    if config.getoption("assertmode") == "rewrite":
        _write_rewritten(config)


def _write_rewritten(config) -> None:
    """Each test file and conftest rewritten as pytest's import hook would, into the cache that hook reads first.

    This reaches into pytest's assertion module (pinned below 10 in pyproject.toml). Where a pytest release moved
    what it uses, nothing is written and each worker rewrites the files itself, as it did before: slower, not wrong.
    """
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc, assertstate_key, get_cache_dir,
        )
        from _pytest.pathlib import fnmatch_ex

        state = config.stash[assertstate_key]
    except (ImportError, AttributeError, KeyError):
        return
    patterns = config.getini("python_files")
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name != "conftest.py" and not any(fnmatch_ex(pattern, path) for pattern in patterns):
            continue
        cache_dir = get_cache_dir(path)
        pyc = cache_dir / (path.name[:-3] + PYC_TAIL)
        try:
            if _read_pyc(path, pyc) is not None:
                continue  # written by an earlier run, and the file has not changed since
            cache_dir.mkdir(exist_ok=True)
            source_key, code = _rewrite_test(path, config)
            _write_pyc(state, code, source_key, pyc)
        except (OSError, SyntaxError, TypeError) as exc:
            # The worker importing this file meets the same error and reports it on the test it belongs to.
            print(f"tests/worker_bytecode.py: {path.relative_to(ROOT)} not pre-rewritten: {exc}", file=sys.stderr)
