"""The one place where errors become what a user sees: one line and an exit code; tracebacks only with --debug."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

import typer

from trackway.errors import TrackwayError


def _debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("TRACKWAY_DEBUG") == "1"


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(argv)
    command = typer.main.get_command(app)
    try:
        # Standalone mode: Typer prints usage errors itself (naming the option, exit 2).
        command.main(args=argv, prog_name="trackway", standalone_mode=True)
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except TrackwayError as exc:
        if debug:
            traceback.print_exc()
        _say(f"trackway: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _say("trackway: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence before a raw traceback
        if debug:
            traceback.print_exc()
            return 1
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _say(f"trackway: internal error: {type(exc).__name__}: {detail} (run with --debug for the traceback)")
        return 1


def _say(line: str) -> None:
    sys.stderr.write(line.rstrip() + "\n")
    sys.stderr.flush()
