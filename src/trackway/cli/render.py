"""Turning ledger rows into what people read: listings that fit the terminal, JSON, short times and durations."""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

from trackway.cli.jsonout import print_json, rows_to_dicts, to_jsonable  # noqa: F401 - re-exported for the commands

# Characters that act on a terminal instead of showing: C0/C1 controls (ESC starts escape
# sequences), and invisible formatting (bidi overrides, zero-width) that makes text read as other text.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")

# A listing column that is never dropped: without it a row cannot be told apart or acted on.
KEY = 1_000_000
GAP = 2  # spaces between columns
ELLIPSIS = "…"
MIN_HANGING = 20  # narrower than this, a wrapped value is harder to read than the terminal's own wrap
HIDDEN_NAMED = 6  # columns named in the "not shown" note; the rest are counted
_HEADER = Style(bold=True)
_NOTE = Style(dim=True)


def printable(value: Any) -> str:
    """`value` as text with terminal-acting characters shown as escapes (a log line may hold any byte)."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], str(value))


def plain(value: Any, style: str = "") -> Text:
    """Text built from data: printed as it is, never read as rich markup (`[oom: ...]` stays on screen)."""
    return Text(printable(value), style=style)


def say(target: Console, line: str | Text) -> None:
    """Print one line built from data: not markup, not highlighted, and not broken at the console's width
    (a piped log keeps each line whole for grep; a terminal wraps it itself)."""
    target.print(line if isinstance(line, Text) else plain(line), highlight=False, soft_wrap=True)


def say_lines(target: Console, lines: Iterable[str]) -> None:
    """Print lines built from data as `say` prints each, in one call: rich's work is per call, not per line
    (a supervisor's burst of 10,000 ends took 1 s printed a line at a time, 0.25 s at once)."""
    text = "\n".join(printable(line) for line in lines)
    if text:
        say(target, Text(text))


def fact(target: Console, label: str, value: Any, label_width: int = 14, indent: int = 2) -> None:
    """One `label  value` line of a record (`show`, `eval show`): a value too long for the terminal wraps under
    itself, never cut; in a pipe or a file it stays on one line for grep."""
    lead = " " * indent + f"{label:<{label_width}}"
    width = target.width if getattr(target, "fits_width", True) else None
    for line in hanging(lead, printable(value), width):
        say(target, line)


def hanging(lead: str, text: str, width: int | None) -> list[str]:
    """`lead + text` as lines of at most `width` cells, continuation lines indented under the text's start."""
    room = width - cell_len(lead) if width else 0
    if width is None or cell_len(lead + text) <= width or room < MIN_HANGING:
        return [lead + text]
    # A word longer than the room (a path, a hash) is never broken: it takes a line of its own, past the
    # width if it must, which the terminal folds for the eye and a copy takes whole.
    chunks = textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False) or [""]
    return [lead + chunks[0]] + [" " * cell_len(lead) + chunk for chunk in chunks[1:]]


# -- consoles ---------------------------------------------------------------------------------------


class _Console(Console):
    """A console that knows whether there is a width to fit: a terminal's (or $COLUMNS), or none (a file, a pipe
    with no terminal behind it), where listings are printed at their natural width and lines are never cut."""

    def __init__(self, *, fits_width: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.fits_width = fits_width

    def print(self, *objects: Any, crop: bool | None = None, **kwargs: Any) -> None:
        # Cropping a line at a width nobody reads at would cut values silently; where there is a
        # width, every renderable here already fits it.
        super().print(*objects, crop=self.fits_width if crop is None else crop, **kwargs)


def real_width(own_fd: int, other_fd: int) -> int | None:
    """The width output should fit: $COLUMNS when set, else the terminal on `own_fd`, then on `other_fd`
    (`trackway runs | less` still has a terminal on stderr); None when no terminal is there at all."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (own_fd, other_fd):
        try:
            if os.isatty(fd):
                return os.get_terminal_size(fd).columns or None
        except OSError:
            continue
    return None


def _console(stderr: bool = False) -> _Console:
    """A console for stdout (or stderr): colour and live status only on a terminal; plain text otherwise."""
    probe = Console(stderr=stderr)
    if probe.is_terminal:
        return _Console(stderr=stderr)  # rich follows the terminal's width as it is resized
    width = real_width(2 if stderr else 1, 1 if stderr else 2)
    if width is not None:
        return _Console(stderr=stderr, width=width)
    # No terminal anywhere: prose wraps at 80 as a reader expects; listings and lines stay whole.
    return _Console(stderr=stderr, width=80, fits_width=False)


console = _console()
err_console = _console(stderr=True)


# -- values -----------------------------------------------------------------------------------------


def short_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def short_sha(value: str | None) -> str:
    return value[:12] if value else "-"


def cell_text(value: Any) -> str:
    """One table cell: on one line, printable, JSON values as compact JSON, a missing value as `-`."""
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    else:
        value = to_jsonable(value)
    # A newline or tab inside a cell would break the row apart: shown as its escape instead.
    return printable(value).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def shorten(text: str, width: int, middle: bool = False) -> str:
    """`text` in at most `width` cells: whole when it fits, else cut with a visible ellipsis (at the end, or in
    the middle so that its beginning and, at twice the length, its end stay readable)."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    if not middle or width < 5:
        return set_cell_size(text, width - 1) + ELLIPSIS
    head = max((width - 1) // 3, 1)  # names tell themselves apart at the end: `…-v2`, `…/seed-1`
    tail = width - 1 - head
    end = text[::-1]
    return set_cell_size(text, head) + ELLIPSIS + set_cell_size(end, tail)[::-1]


# -- listings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """How one listing column gives way when the width is short."""

    header: str
    keep: int = 0  # the column with the lowest `keep` is dropped first; KEY columns never are
    shorten_to: int = 0  # text may be cut down to this many cells, with an ellipsis; 0: shown whole or dropped
    right: bool = False  # numbers line up on the right
    middle: bool = False  # shortened in the middle: names that differ only at the end (`…/seed-0`) stay apart
    shorten_at: int | None = None  # when text starts to give way, if not at `keep` (0: before any column goes)


class Listing:
    """A table that fits the width it is printed at.

    The least important columns are dropped first; then text columns that may be shortened are
    cut with an ellipsis, least important first. A number (any column without `shorten_to`) is
    shown whole or its column is dropped. When even the KEY columns do not fit, each row is
    printed as a block of `header: value` lines. With no width to fit (output to a file or a pipe
    with no terminal), every column is shown whole.
    """

    def __init__(self, title: str | None, columns: Sequence[Column], rows: Iterable[Sequence[Any]]):
        self.title = title
        self.columns = list(columns)
        self.cells = [[cell_text(v) for v in row] for row in rows]
        self.natural = [
            max([cell_len(printable(c.header))] + [cell_len(row[i]) for row in self.cells])
            for i, c in enumerate(self.columns)
        ]

    def _floor(self, i: int) -> int:
        """The narrowest column `i` may become: its shortening limit, or its natural width."""
        limit = self.columns[i].shorten_to
        return min(self.natural[i], max(limit, 2)) if limit else self.natural[i]

    def _span(self, shown: Iterable[int], widths: Sequence[int]) -> int:
        shown = list(shown)
        return sum(widths[i] for i in shown) + GAP * max(len(shown) - 1, 0)

    def layout(self, width: int | None) -> list[int] | None:
        """Cells per column (0: dropped) to fit `width`; None when the KEY columns alone do not fit.

        Columns give way from the least important (lowest `keep`; among equals, the rightmost): text
        is first shortened down to its floor (at `shorten_at` when set), then the column goes. Columns
        dropped on the way that fit in the room left are then put back, the most important first.
        """
        widths = list(self.natural)
        if width is None or self._span(range(len(widths)), widths) <= width:
            return widths
        dropped = self._give_way(widths, width)
        if self._span(self._shown(widths), widths) > width:
            return None
        for i in sorted(dropped, key=lambda i: (-self.columns[i].keep, i)):
            room = width - self._span(self._shown(widths), widths) - GAP
            if room >= self._floor(i):
                widths[i] = min(self.natural[i], room)
        return widths

    def _give_way(self, widths: list[int], width: int) -> list[int]:
        """Shorten and drop columns in `widths` (in place), least important first, until they fit `width`;
        the columns dropped."""
        steps = [(c.keep if c.shorten_at is None else c.shorten_at, 0, -i) for i, c in enumerate(self.columns)]
        steps += [(c.keep, 1, -i) for i, c in enumerate(self.columns) if c.keep < KEY]
        dropped: list[int] = []
        for _, drop, i in sorted(steps):
            excess = self._span(self._shown(widths), widths) - width
            if excess <= 0:
                break
            if drop:
                widths[-i] = 0
                dropped.append(-i)
            else:
                widths[-i] -= min(excess, widths[-i] - self._floor(-i))
        return dropped

    @staticmethod
    def _shown(widths: Sequence[int]) -> list[int]:
        return [i for i, w in enumerate(widths) if w]

    def lines(self, width: int | None) -> list[Text]:
        """The listing as lines of text at `width` (None: natural width)."""
        out = [Text(printable(self.title))] if self.title else []
        widths = self.layout(width)
        if widths is None:
            return out + self._blocks()
        shown = [i for i, w in enumerate(widths) if w]
        out.append(self._row([printable(self.columns[i].header) for i in shown], shown, widths, _HEADER))
        out.append(Text("─" * self._span(shown, widths), no_wrap=True, overflow="ignore"))
        out.extend(self._row([row[i] for i in shown], shown, widths) for row in self.cells)
        hidden = [printable(self.columns[i].header) for i, w in enumerate(widths) if not w]
        if hidden:
            out.append(Text(f"not shown at {width} columns: {_named(hidden)} (a wider terminal or --json shows them)",
                            style=_NOTE))
        return out

    def _row(self, cells: list[str], shown: list[int], widths: list[int], style: Style | None = None) -> Text:
        parts = []
        for cell, i in zip(cells, shown):
            text = shorten(cell, widths[i], self.columns[i].middle)
            pad = " " * (widths[i] - cell_len(text))
            parts.append(pad + text if self.columns[i].right else text + pad)
        # Rows are laid out to fit already: rich must neither wrap them nor cut them.
        return Text((" " * GAP).join(parts).rstrip(), style=style or "", no_wrap=True, overflow="ignore")

    def _blocks(self) -> list[Text]:
        """Each row as `header: value` lines: a width too short for a table still shows every value whole."""
        label = max(cell_len(printable(c.header)) for c in self.columns)
        out: list[Text] = []
        for row in self.cells:
            if out:
                out.append(Text(""))
            for column, cell in zip(self.columns, row):
                out.append(Text(f"{printable(column.header):<{label}}  {cell}"))  # long values wrap, whole
        return out

    def text(self, width: int | None) -> str:
        """The listing as plain text at `width` (for tests and for writing to a file)."""
        return "\n".join(line.plain for line in self.lines(width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Natural width only at the top level: inside a panel, lines wider than it would be cropped.
        natural = not getattr(console, "fits_width", True) and options.max_width >= console.width
        width = None if natural else options.max_width
        yield from self.lines(width)  # the title and the note are prose: rich wraps them

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = self.layout(options.max_width) or self.natural
        shown = [i for i, w in enumerate(widths) if w]
        return Measurement(min(self._span(shown, widths), options.max_width), self._span(shown, self.natural))


def _named(headers: list[str]) -> str:
    """The first HIDDEN_NAMED headers by name, the rest counted."""
    more = len(headers) - HIDDEN_NAMED
    return ", ".join(headers[:HIDDEN_NAMED]) + (f" and {more} more" if more > 0 else "")


def table(
    title: str | None,
    columns: Sequence[str | Column],
    rows: Iterable[Sequence[Any]],
    squeeze: Sequence[str] = (),
) -> Listing:
    """A listing; plain-text `columns` matter less from left to right (the first is a KEY), and those named in
    `squeeze` may be shortened with an ellipsis."""
    count = len(columns)
    spec = [
        c if isinstance(c, Column)
        else Column(c, keep=KEY if i == 0 else count - i, shorten_to=12 if c in squeeze else 0)
        for i, c in enumerate(columns)
    ]
    return Listing(title, spec, rows)
