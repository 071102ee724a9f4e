"""The error tree: every error trackway raises on purpose, each with its exit code and HTTP status.

    TrackwayError                 exit 1, 500   something went wrong that is not the user's input
    ├── InputError                exit 2, 400   bad input: names the field and what was expected
    │   ├── NotFound              exit 2, 404   a run, attempt or file that does not exist
    │   ├── Ambiguous             exit 2, 409   a name that matches more than one run
    │   └── ReadOnlyViolation     exit 2, 403   `trackway sql` was asked to change something
    ├── LedgerError               exit 3, 503   the ledger failed: locked, disk full, unreachable, damaged
    │   └── LedgerUnavailable     exit 3, 503   the ledger cannot be reached or opened
    └── ExecutorError             exit 1, 502   an executor refused or failed to start an attempt

Messages are one line and say what to do; the CLI prints them as they are.
"""

from __future__ import annotations


class TrackwayError(Exception):
    """Something went wrong that is not the user's input."""

    exit_code = 1
    http_status = 500


class InputError(TrackwayError):
    """Bad input: the message names the field and what was expected."""

    exit_code = 2
    http_status = 400


class NotFound(InputError):
    """A run, attempt, checkpoint or file that does not exist."""

    http_status = 404


class Ambiguous(InputError):
    """A reference that matches more than one thing."""

    http_status = 409


class ReadOnlyViolation(InputError):
    """A query that would change the ledger, sent where only reading is allowed."""

    http_status = 403


class LedgerError(TrackwayError):
    """The ledger failed for reasons outside the input: locked past the busy timeout, disk full, unreachable.

    The message names the ledger (its URL, password redacted) and what happened, in one line.
    Every database error that is not about the input becomes one of these (see
    `trackway.ledger.store.ledger_error`), on SQLite and PostgreSQL alike.
    """

    exit_code = 3
    http_status = 503


class LedgerUnavailable(LedgerError):
    """The ledger cannot be opened or reached."""


class ExecutorError(TrackwayError):
    """An executor refused or failed to start, poll or cancel an attempt."""

    http_status = 502
