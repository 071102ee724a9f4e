"""The one place where errors become what a user sees: one line and an exit code; tracebacks only with --debug."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

import typer

from trackway.errors import LedgerError, TrackwayError

# True of every command: training processes write only to their attempt's spool, never to the
# ledger, and the spool is ingested once the ledger answers again. (The SDK alone, outside trackway,
# is the one training process that writes to a ledger, and it never goes through this module.)
TRAINING_GOES_ON = "; training is not affected: attempts keep writing to their spool, ingested when the ledger is back"


def _debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("TRACKWAY_DEBUG") == "1"


def run_app(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(argv)
    command = typer.main.get_command(app)

    def tell(line: str) -> None:
        # An error's suggested `trackway ...` must work when pasted: with the --db/--home given here.
        from trackway.cli.context import given_global_options, repeat_global_options

        _say(repeat_global_options(line, *given_global_options(argv)))

    try:
        # Standalone mode: Typer prints usage errors itself (naming the option, exit 2).
        command.main(args=argv, prog_name="trackway", standalone_mode=True)
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except TrackwayError as exc:
        if debug:
            traceback.print_exc()
        tell(f"trackway: error: {exc}{TRAINING_GOES_ON if isinstance(exc, LedgerError) else ''}")
        return exc.exit_code
    except KeyboardInterrupt:
        _say("trackway: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence before a raw traceback
        ledger_failure = _as_ledger_error(exc)
        if ledger_failure is not None:  # raised outside a Ledger transaction: the same mapping, the same line
            if debug:
                traceback.print_exc()
            tell(f"trackway: error: {ledger_failure}{TRAINING_GOES_ON}")
            return ledger_failure.exit_code
        if debug:
            traceback.print_exc()
            return 1
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _say(f"trackway: internal error: {type(exc).__name__}: {detail} (run with --debug for the traceback)")
        return 1


def _as_ledger_error(exc: BaseException) -> LedgerError | None:
    from trackway.ledger.store import as_ledger_error

    return as_ledger_error(exc)


def _say(line: str) -> None:
    sys.stderr.write(line.rstrip() + "\n")
    sys.stderr.flush()
