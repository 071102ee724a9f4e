"""What text a regular expression cannot match, told from the literal pieces every match must contain.

Python's `re` looks for a match at each position of the text in turn. A case-insensitive
pattern that does not start with a literal gets no help to skip ahead: one of the classifier's
log rules takes about a millisecond over a 200-line log tail, and a failed attempt's tail is read
by ten of them. Most of those rules cannot match most logs, and a substring search (`in`) says
so a hundred times faster: a pattern such as `CUDA out of memory|OutOfMemoryError` can only
match text that holds one of those two strings.

`needs(pattern)` reads the pattern's parse (`re._parser`, the parser `re.compile` itself uses)
into what any match must hold: strings, all of some, any of others. `fold(text)` spells text as
the prefilter compares it: lower case, with the four non-ASCII letters that a case-insensitive
`re` matches to an ASCII one written as that letter. A prefilter can only say "cannot match":
where it is unsure it says "may", and the pattern is asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from re import _constants as sre  # the constants re._parser's parse is written in (3.11+)
from re import _parser

# The non-ASCII characters `re` matches to an ASCII letter under IGNORECASE (every code point asked, once:
# tests/test_regex_prefilter.py), as that letter. Mapped before lowering: `"İ".lower()` is two characters.
_LIKE_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
_ODD_LETTERS = tuple(map(chr, _LIKE_ASCII))


def fold(text: str) -> str:
    """`text` as prefilters compare it (see the module): where a case-insensitive pattern's ASCII literal matches
    in `text`, it is found, lowered, in `fold(text)`."""
    if text.isascii() or not any(char in text for char in _ODD_LETTERS):
        return text.lower()
    return text.translate(_LIKE_ASCII).lower()  # (a translation is slow: a progress bar's line asks it otherwise)


@dataclass(frozen=True)
class Need:
    """Every one (`all`) or one at least (`any`) of `parts`: a string found in the folded text, or a Need of its own."""

    all: bool
    parts: tuple[str | Need, ...]

    def met_by(self, folded: str) -> bool:
        test = all if self.all else any
        return test(part in folded if isinstance(part, str) else part.met_by(folded) for part in self.parts)


class Prefilter:
    """Whether a pattern may match a text, from what every match must contain (`needs`); `may_match` is never
    False where the pattern matches."""

    def __init__(self, pattern: re.Pattern[str]):
        self.need = needs(pattern)

    def may_match(self, folded: str) -> bool:
        """False only where the pattern matches nowhere in the text `folded` was folded from (`fold`)."""
        return self.need is None or (self.need in folded if isinstance(self.need, str) else self.need.met_by(folded))


def needs(pattern: re.Pattern[str]) -> str | Need | None:
    """What any match of `pattern` contains, folded (see `fold`); None when nothing is known to be in every match."""
    if not isinstance(pattern.pattern, str):
        return None
    return _in_sequence(_parser.parse(pattern.pattern, pattern.flags))


# A class of at most this many characters continues a run of literals as that many spellings (`gh[pousr]_`: five),
# and a run is kept while it has at most RUN_SPELLINGS of them.
CLASS_CHARS = 8
RUN_SPELLINGS = 32


def _in_sequence(items) -> str | Need | None:
    """Every piece a sequence of parsed items needs, each a run of literals or what one item needs."""
    found: list[str | Need] = []
    run = [""]  # the run of literals so far, in each spelling its classes allow
    for op, value in items:
        chars = _small_class(value) if op is sre.IN else [chr(value)] if op is sre.LITERAL and value < 0x80 else None
        if chars is not None and len(run) * len(chars) <= RUN_SPELLINGS:
            run = [spelled + char for spelled in run for char in chars]
            continue
        # Anything else ends a run: a non-ASCII letter too, whose other cases `fold` may not write alike.
        _close(run, found)
        run = [""] if chars is None else list(chars)
        need = _in_item(op, value) if chars is None else None
        if need is not None:
            found.append(need)
    _close(run, found)
    if not found:
        return None
    return found[0] if len(found) == 1 else Need(True, tuple(found))


def _small_class(members) -> list[str] | None:
    """The characters of a class (`[pousr]`, `[a-c]`) as folded strings, when it is a few ASCII ones; else None."""
    chars: set[str] = set()
    for op, value in members:
        if op is sre.LITERAL and value < 0x80:
            chars.add(chr(value))
        elif op is sre.RANGE and value[1] < 0x80 and value[1] - value[0] < CLASS_CHARS:
            chars.update(chr(code) for code in range(value[0], value[1] + 1))
        else:
            return None  # a negated class, a category (\d, \w), a wide range, a non-ASCII character
    folded = sorted({fold(char) for char in chars})
    return folded if len(folded) <= CLASS_CHARS else None


def _close(run: list[str], found: list[str | Need]) -> None:
    """Add a finished run of literals to what a sequence needs: one spelling, or any of several."""
    spellings = sorted({fold(spelled) for spelled in run if spelled})
    if len(spellings) == 1:
        found.append(spellings[0])
    elif spellings:
        found.append(Need(False, tuple(spellings)))


def _in_item(op, value) -> str | Need | None:
    if op is sre.SUBPATTERN:
        return _in_sequence(value[-1])  # (group, flags added, flags removed, pattern): folding covers either case
    if op is sre.ATOMIC_GROUP:
        return _in_sequence(value)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, _, body = value
        return _in_sequence(body) if low >= 1 else None
    if op is sre.BRANCH:
        branches = [_in_sequence(branch) for branch in value[1]]
        # A branch that needs nothing lets the whole alternation match without any of the others' pieces.
        return None if any(need is None for need in branches) else Need(False, tuple(branches))
    return None  # a class, any character, an anchor, a look-around, a back-reference: no piece that must be there
