"""Redaction of common secret shapes, for text that a training process printed and the ledger keeps.

The ledger is shared and queried by anyone (`trackway sql`, the dashboard), so nothing copied
into it from a process's output or environment may carry a usable credential. What is replaced
by `***`:

- the password of a URL: `postgresql://bob:***@db/x`;
- tokens with a known prefix (GitHub, Hugging Face, OpenAI, Anthropic, Slack, AWS, GitLab, npm),
  keeping the prefix so a reader still sees which kind of token it was: `hf_***`;
- JSON Web Tokens, `Bearer <token>`, PEM private key blocks;
- the value of `KEY=value`, `KEY: value`, `"key": "value"`, `--key value` pairs whose key looks
  like it names a secret (`is_secret_name`);
- with `known`, the values a run is known to hold (its secret variables, the command-line words
  redaction hid), wherever they appear: a script that prints `$MY_PASSWORD` says no `KEY=` before
  it. Only values of at least KNOWN_MIN_CHARS characters, so that a secret `1` masks no step number.

Everything else stays as it was, so a redacted log is still a log: loss values, paths, git
hashes, step counters and `--lr 3e-4` are untouched. `redact` is idempotent.

Every pattern is anchored by a look-behind that allows a match to start only at the start of a
word and has no nested quantifiers, so the time is linear in the length of the text; a long
adversarial line costs no more than an ordinary one of the same length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "MASK", "LineRedactor", "LogRedactor", "hidden_values", "is_secret_name", "known_values", "looks_secret", "redact",
    "redact_argv", "redact_lines", "redact_structure", "redact_url",
]

MASK = "***"
KNOWN_MIN_CHARS = 6

# --- names -----------------------------------------------------------------------------------

_SECRET_WORDS = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE_?KEY|API_?KEY|ACCESS_?KEY|AUTH|"
    r"SESSION_?KEY|COOKIE"
)
_SECRET_ENDINGS = ("_KEY", "_PAT", "_DSN")
# Names that contain a secret word but count things or configure a tokenizer: training logs and
# environments are full of them (TOKENIZERS_PARALLELISM, max_new_tokens, eos_token_id, the
# author of a commit), and hiding them would make logs unreadable without protecting anything.
_BENIGN_WORDS = re.compile(
    r"TOKENI[SZ]|TOKENS|TOKEN_(?:IDS?|COUNT|TYPE|LEN)|(?:PAD|EOS|BOS|UNK|SEP|CLS|MASK)_TOKEN|AUTHOR(?!I[SZ])"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _normal_name(name: str) -> str:
    """`hfToken`, `hf-token`, `model.hf_token` -> `HF_TOKEN`-style upper snake case."""
    return re.sub(r"[^A-Za-z0-9]+", "_", _CAMEL.sub("_", name)).upper()


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or key called `name` probably holds a secret."""
    return _is_secret_name(name)


@lru_cache(maxsize=4096)  # redact asks about every `key=` in a log; the same few keys recur
def _is_secret_name(name: str) -> bool:
    normal = _normal_name(name)
    if normal.endswith(_SECRET_ENDINGS):
        return True
    # Blank the benign words rather than delete them, so that what is left cannot join into a
    # secret word that was not there (TOKEN + S_ECRET).
    remaining = _BENIGN_WORDS.sub(lambda m: "#" * len(m.group()), normal)
    return _SECRET_WORDS.search(remaining) is not None


# --- values ----------------------------------------------------------------------------------

_W = r"A-Za-z0-9_"  # word characters, for the look-behinds that anchor every pattern

# scheme://user:password@host — the user may be empty (`redis://:pw@host`); a password may hold
# `@` when the caller did not escape it, so it runs to the last `@` before the path.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/@]*:)(?P<password>[^\s/]+)@"
)

_TOKENS = re.compile(
    rf"(?<![{_W}\-])(?:"
    r"(?P<gh>gh[pousr]_)[A-Za-z0-9]{20,}"
    r"|(?P<ghpat>github_pat_)[A-Za-z0-9_]{20,}"
    r"|(?P<hf>hf_)[A-Za-z0-9]{30,}"
    r"|(?P<anthropic>sk-ant-)[A-Za-z0-9_\-]{10,}"
    r"|(?P<openai>sk-)[A-Za-z0-9_\-]{20,}"
    r"|(?P<slack>xox[abpr]-)[A-Za-z0-9\-]{10,}"
    r"|(?P<aws>AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|(?P<gitlab>glpat-)[A-Za-z0-9_\-]{20,}"
    r"|(?P<npm>npm_)[A-Za-z0-9]{30,}"
    r"|(?P<jwt>eyJ)[A-Za-z0-9_\-]{4,}\.eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"
    r")"
)

_PEM = re.compile(
    r"(?P<begin>-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----).*?(?P<end>-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----|\Z)",
    re.DOTALL,
)
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----")

# Scheme words stay so that `Authorization: Bearer ***` still says what it was.
_BEARER = re.compile(rf"(?<![{_W}])(?P<scheme>Bearer)[ \t]+(?P<token>[A-Za-z0-9\-._~+/]+=*)", re.IGNORECASE)

# KEY=value, KEY: value, "key": "value", key='value'. Only the key and separator are consumed
# when scanning, so a pair inside the value of another (`url=https://h/?token=abc`) is still
# found. The value runs to the next whitespace or separator, or to the closing quote when it is
# quoted (to the end of the line when the quote never closes: a truncated line must not leak what
# follows the quote).
_PAIR_KEY = re.compile(
    rf"(?<![{_W}.])(?<!://)(?P<q>[\"']?)(?P<key>[A-Za-z_][{_W}.\-]*)(?P=q)[ \t]*(?::(?!//)|=)[ \t]*"
)
_PAIR_VALUE = re.compile(
    r"(?:(?:Bearer|Basic|Token)[ \t]+)?"
    r"(?:(?P<open>[\"'])(?P<quoted>[^\"'\n]*)(?P<close>[\"']?)|(?P<bare>[^\s\"',;&}\]]+))"
)
# --key value / -key value on a command line (the `--key=value` form is a pair above).
_FLAG_KEY = re.compile(rf"(?<![{_W}\-])--?(?P<key>[A-Za-z][{_W}\-]*)[ \t]+")
_FLAG_VALUE = re.compile(r"(?P<bare>[^\s\"'\-][^\s\"']*)")


def _token(match: re.Match) -> str:
    if match.group("jwt") is not None:
        return f"eyJ{MASK}"
    prefix = next(value for value in match.groupdict().values() if value is not None)
    return f"{prefix}{MASK}"


def _redact_values(text: str, keys: re.Pattern, values: re.Pattern) -> str:
    """Replace the value after every key that `is_secret_name`, leaving the rest as it was."""
    out: list[str] = []
    done = 0  # text[:done] is already in `out`
    for key in keys.finditer(text):
        if key.start() < done or not is_secret_name(key.group("key")):
            continue
        value = values.match(text, key.end())
        if value is None:
            continue
        if value.group("bare") is not None:
            start, end, replacement = value.start("bare"), value.end("bare"), MASK
        elif value.group("quoted"):
            start, end, replacement = value.start("quoted"), value.end("quoted"), MASK
        else:
            continue  # password="" holds nothing
        out.append(text[done:start])
        out.append(replacement)
        done = end
    out.append(text[done:])
    return "".join(out)


def known_values(values: Iterable[str]) -> tuple[str, ...]:
    """The values worth masking wherever they appear (see the module docstring), longest first.

    Longest first, so that a value holding another is masked whole rather than around the shorter one.
    """
    kept = {v for v in values if isinstance(v, str) and len(v) >= KNOWN_MIN_CHARS and v != MASK}
    return tuple(sorted(kept, key=lambda v: (-len(v), v)))


def _mask_known(text: str, known: Sequence[str]) -> str:
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact(text: str, known: Sequence[str] = ()) -> str:
    """`text` with the secret parts replaced by `***`; everything else unchanged.

    `known`: values to mask wherever they appear, as `known_values` returns them.
    """
    if not text:
        return text
    text = _mask_known(text, known)
    text = _PEM.sub(lambda m: f"{m.group('begin')}{MASK}{m.group('end')}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{MASK}@", text)
    text = _TOKENS.sub(_token, text)
    text = _BEARER.sub(lambda m: f"{m.group('scheme')} {MASK}", text)
    text = _redact_values(text, _PAIR_KEY, _PAIR_VALUE)
    return _redact_values(text, _FLAG_KEY, _FLAG_VALUE)


def redact_lines(lines: Iterable[str], known: Sequence[str] = ()) -> list[str]:
    """Each line redacted, one output line per input line.

    A PEM private key printed over several lines is hidden whole: its base64 body lines carry no
    shape of their own, so they are recognised by lying between the BEGIN and END lines.
    """
    redactor = LineRedactor(known)
    return [redactor.line(line) for line in lines]


class LineRedactor:
    """`redact_lines` one line at a time, for lines that arrive over time (a log being followed)."""

    def __init__(self, known: Sequence[str] = ()):
        self.known = known
        self._inside_key = False

    def line(self, line: str) -> str:
        """`line` (without its line ending) redacted, given the lines before it."""
        if self._inside_key:
            end = _PEM_END.search(line)
            if end is None:
                return MASK
            self._inside_key = False
            return MASK + redact(line[end.start() :], self.known)
        begin = _PEM_BEGIN.search(line)
        if begin is not None and _PEM_END.search(line, begin.end()) is None:
            self._inside_key = True
            return redact(line[: begin.end()], self.known) + MASK
        return redact(line, self.known)


class LogRedactor:
    """A log's bytes redacted as they are read, chunk by chunk, line by line.

    A line is let through once it is whole (up to its newline, or the carriage return that ends a
    progress bar's frame), so that a token cut between two reads is never let out half masked;
    `end()` lets the rest through once nothing more can follow. A line longer than MAX_LINE_BYTES
    is let through in pieces, so that memory stays bounded whatever the process prints. Bytes that
    are not UTF-8 pass through unchanged.
    """

    MAX_LINE_BYTES = 64 * 1024

    def __init__(self, known: Sequence[str] = ()):
        self._lines = LineRedactor(known)
        self._partial = b""

    @property
    def held(self) -> int:
        """How many bytes of an unfinished line are held back."""
        return len(self._partial)

    def feed(self, chunk: bytes) -> bytes:
        """The whole lines `chunk` completes, redacted; the rest is held for the next chunk."""
        data = self._partial + chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if cut == 0 and len(data) > self.MAX_LINE_BYTES:
            cut = len(data)
        self._partial = data[cut:]
        return self._redact(data[:cut])

    def end(self) -> bytes:
        """The held unfinished line, redacted: the log has ended."""
        rest, self._partial = self._partial, b""
        return self._redact(rest)

    def _redact(self, data: bytes) -> bytes:
        if not data:
            return data
        out: list[str] = []
        for text, ending in _LINE.findall(data.decode("utf-8", "surrogateescape")):
            # An empty piece is the `\n` of a `\r\n` read apart: no line of its own.
            out.append((self._lines.line(text) if text else text) + ending)
        return "".join(out).encode("utf-8", "surrogateescape")


_LINE = re.compile(r"([^\r\n]*)(\r\n|\r|\n|\Z)")


def redact_structure(value: object, known: Sequence[str] = ()) -> object:
    """A JSON-like structure with every string in it redacted (keys too), so it stays valid JSON.

    A string under a key that names a secret (`{"hf_token": "abc"}`) is hidden whole.
    """
    if isinstance(value, str):
        return _redact_short(value, known)
    if isinstance(value, dict):
        return {
            _redact_short(k, known) if isinstance(k, str) else k: (
                v if v is None or isinstance(v, (int, float))  # nothing to hide, no call to make (bool is an int)
                else MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v
                else redact_structure(v, known)
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, str) for item in value):
            return redact_lines(value, known)
        return [redact_structure(item, known) for item in value]
    return value


SHORT_CACHED_CHARS = 64


def _redact_short(text: str, known: Sequence[str]) -> str:
    """`redact`, remembered for short strings: the same few recur in every record of a kind (an evidence
    record's keys and rule, an event's keys, an exception's name), and a burst of ends redacts thousands.

    Kept for short strings only, so that what the cache holds stays small whatever a script prints.
    """
    if isinstance(known, tuple) and len(text) <= SHORT_CACHED_CHARS:
        return _redact_known_short(text, known)
    return redact(text, known)


@lru_cache(maxsize=4096)
def _redact_known_short(text: str, known: tuple[str, ...]) -> str:
    return redact(text, known)


def redact_argv(argv: Sequence[str], known: Sequence[str] = ()) -> list[str]:
    """A command line with its secret parts replaced by `***`, word for word.

    Each word is redacted as text (`--api-key=abc`, a URL's password, a token's shape, `known`
    values); the word after a flag that names a secret (`--token abc`, `-password abc`) is hidden
    whole, since it may have no shape of its own.
    """
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next and word and not word.startswith("-"):
            out.append(MASK)
        else:
            out.append(redact(word, known))
        flag = _FLAG_KEY.fullmatch(word + " ")
        hide_next = flag is not None and is_secret_name(flag.group("key"))
    return out


def hidden_values(original: str, redacted: str) -> list[str]:
    """The parts of `original` that `redacted` (made from it by this module) replaced by `***`.

    Redaction only ever replaces spans with `***`, so the text between the masks is the
    original's; the values are what lies between those pieces.
    """
    if original == redacted:
        return []
    pieces = redacted.split(MASK)
    pattern = "(.*?)".join(re.escape(piece) for piece in pieces)
    match = re.fullmatch(pattern, original, re.DOTALL)
    return [value for value in match.groups() if value] if match else [original]


def looks_secret(value: str) -> bool:
    """Whether `value` holds something with a common secret shape (see the module docstring)."""
    return bool(value) and redact(value) != value


def redact_url(url: str) -> str:
    """A database or service URL with its password (and secret query parameters) replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    netloc = parts.netloc
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        if password:
            netloc = f"{user}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(key) for key, _ in pairs):
            query = urlencode([(key, MASK if is_secret_name(key) and v else v) for key, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return redact(url)
    return redact(urlunsplit(parts._replace(netloc=netloc, query=query)))
