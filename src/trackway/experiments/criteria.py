"""The criteria language: one comparison over run quantities, parsed by hand and evaluated by walking the tree.

A criterion is what a hypothesis expects, checkable by numbers:

    final.loss <= baseline.final.loss * 1.05
    wall_hours <= 0.5 * baseline.wall_hours
    eval.pass@1 > 0.05
    steps_to(loss, baseline.final.loss) <= 0.5 * baseline.steps

Grammar (nothing else is accepted; no name is ever looked up in Python, nothing is `eval`ed):

    criterion := sum ("<" | "<=" | ">" | ">=" | "==" | "!=") sum
    sum       := term (("+" | "-") term)*
    term      := unary (("*" | "/") unary)*
    unary     := "-" unary | atom
    atom      := NUMBER | quantity | call | "(" sum ")"
    quantity  := ["baseline."] (SCALAR | PREFIX "." METRIC)
    call      := ["baseline."] "steps_to" "(" METRIC "," sum ")" | "abs" "(" sum ")"

SCALAR is one of `wall_hours gpu_hours cost_usd throughput steps`; PREFIX one of
`final best min max mean eval`; METRIC a logged key (`loss`, `train/loss`, `pass@1`).
What each quantity means is `QUANTITIES`, said the same way in `trackway experiment new --help`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from trackway.errors import InputError

MAX_LENGTH = 500
MAX_DEPTH = 32

SCALARS = {
    "wall_hours": "hours from the run's first attempt starting to its last one ending",
    "gpu_hours": "GPU-hours of the run's attempts",
    "cost_usd": "cost of the run's attempts (the resources' cost per GPU-hour)",
    "throughput": "mean of the logged metric `throughput`, else steps per second of the run's attempts",
    "steps": "the run's last logged step",
}
PREFIXES = {
    "final": "the metric's last logged value",
    "best": "the metric's best logged value (lowest for loss/error/perplexity keys, else highest)",
    "min": "the metric's lowest logged value",
    "max": "the metric's highest logged value",
    "mean": "the mean of the metric's logged values",
    "eval": "the aggregated evaluation metric of the run's best evaluated checkpoint",
}
FUNCTIONS = {
    "steps_to": "steps_to(METRIC, X): the first step at which the metric reached X (at or below for loss-like keys)",
    "abs": "abs(X): the absolute value",
}
QUANTITIES = {**SCALARS, **{f"{p}.<metric>": m for p, m in PREFIXES.items()}, **FUNCTIONS}
COMPARISONS = ("<=", ">=", "==", "!=", "<", ">")

_TOKEN = re.compile(
    r"\s*(?:"
    r"(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_@/:.]*(?<!\.))"
    r"|(?P<op><=|>=|==|!=|<|>|\+|-|\*|/|\(|\)|,)"
    r")"
)


class CriterionError(InputError):
    """A criterion that does not parse: the message says where (1-based column) and what was expected."""

    def __init__(self, text: str, position: int, expected: str) -> None:
        self.position = position
        shown = text if len(text) <= 80 else text[:77] + "..."
        super().__init__(f"criterion {shown!r}: at column {position + 1}: {expected}")


# -- the tree ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    value: float

    def text(self) -> str:
        return f"{self.value:g}"


@dataclass(frozen=True)
class Quantity:
    """One number about a run: `kind` is a SCALAR or a PREFIX (with `metric`), or `steps_to` (with `target`)."""

    kind: str
    metric: str | None = None
    baseline: bool = False
    target: object = None  # steps_to's threshold: a node

    def text(self) -> str:
        where = "baseline." if self.baseline else ""
        if self.kind == "steps_to":
            return f"{where}steps_to({self.metric}, {self.target.text()})"
        return f"{where}{self.kind}.{self.metric}" if self.metric is not None else f"{where}{self.kind}"


@dataclass(frozen=True)
class Call:
    name: str  # abs
    argument: object

    def text(self) -> str:
        return f"{self.name}({self.argument.text()})"


@dataclass(frozen=True)
class Negate:
    operand: object

    def text(self) -> str:
        return f"-{self.operand.text()}"


@dataclass(frozen=True)
class Binary:
    op: str
    left: object
    right: object

    def text(self) -> str:
        return f"({self.left.text()} {self.op} {self.right.text()})"


@dataclass(frozen=True)
class Criterion:
    """A parsed criterion: `left op right`, and the text it was parsed from."""

    source: str
    op: str
    left: object
    right: object

    def quantities(self) -> list[Quantity]:
        """Every quantity it reads, in order (a steps_to's target's too)."""
        found: list[Quantity] = []

        def walk(node: object) -> None:
            if isinstance(node, Quantity):
                found.append(node)
                if node.target is not None:
                    walk(node.target)
            elif isinstance(node, Call):
                walk(node.argument)
            elif isinstance(node, Negate):
                walk(node.operand)
            elif isinstance(node, Binary):
                walk(node.left)
                walk(node.right)

        walk(self.left)
        walk(self.right)
        return found


# -- parsing ----------------------------------------------------------------------------------


@dataclass
class _Token:
    kind: str  # number, name, op, end
    text: str
    at: int


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    at = 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None or match.lastgroup is None:
            spot = at + (len(text[at:]) - len(text[at:].lstrip()))
            raise CriterionError(text, spot, f"unexpected character {text[spot]!r}")
        kind = match.lastgroup
        tokens.append(_Token(kind, match.group(kind), match.start(kind)))
        at = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0

    @property
    def here(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, expected: str, token: _Token | None = None) -> CriterionError:
        token = token or self.here
        found = "the end" if token.kind == "end" else repr(token.text)
        return CriterionError(self.text, token.at, f"expected {expected}, found {found}")

    def take(self, kind: str, text: str | None = None) -> _Token | None:
        token = self.here
        if token.kind == kind and (text is None or token.text == text):
            self.i += 1
            return token
        return None

    def expect(self, text: str) -> None:
        if self.take("op", text) is None:
            raise self.fail(repr(text))

    def criterion(self) -> Criterion:
        left = self.sum()
        token = self.here
        if token.kind != "op" or token.text not in COMPARISONS:
            raise self.fail("a comparison (<, <=, >, >=, ==, !=)")
        self.i += 1
        right = self.sum()
        if self.here.kind != "end":
            raise self.fail("the end of the criterion (one comparison per --expect)")
        return Criterion(self.text, token.text, left, right)

    def sum(self) -> object:
        node = self.term()
        while (token := self.take("op", "+") or self.take("op", "-")) is not None:
            node = Binary(token.text, node, self.term())
        return node

    def term(self) -> object:
        node = self.unary()
        while (token := self.take("op", "*") or self.take("op", "/")) is not None:
            node = Binary(token.text, node, self.unary())
        return node

    def unary(self) -> object:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"at most {MAX_DEPTH} levels of nesting")
        try:
            if self.take("op", "-") is not None:
                return Negate(self.unary())
            return self.atom()
        finally:
            self.depth -= 1

    def atom(self) -> object:
        token = self.here
        if (number := self.take("number")) is not None:
            return Number(float(number.text))
        if self.take("op", "(") is not None:
            node = self.sum()
            self.expect(")")
            return node
        if (name := self.take("name")) is not None:
            return self.named(name)
        raise self.fail("a number, a quantity (e.g. final.loss, wall_hours) or '('", token)

    def named(self, token: _Token) -> object:
        word = token.text
        baseline = word.startswith("baseline.")
        if baseline:
            word = word[len("baseline."):]
        if word in FUNCTIONS:
            return self.call(token, word, baseline)
        if word in SCALARS:
            return Quantity(word, baseline=baseline)
        prefix, dot, metric = word.partition(".")
        if prefix in PREFIXES and dot and metric:
            return Quantity(prefix, metric, baseline)
        if prefix in PREFIXES:
            raise CriterionError(self.text, token.at, f"expected a metric after {prefix}., e.g. {prefix}.loss")
        known = ", ".join([*SCALARS, *(f"{p}.<metric>" for p in PREFIXES), *(f"{f}(...)" for f in FUNCTIONS)])
        raise CriterionError(self.text, token.at, f"unknown quantity {token.text!r}; expected one of {known}, "
                                                  "each also as baseline.<...>")

    def call(self, token: _Token, name: str, baseline: bool) -> object:
        self.expect("(")
        if name == "abs":
            if baseline:
                raise CriterionError(self.text, token.at, "abs(...) takes no baseline. prefix; put it inside")
            argument = self.sum()
            self.expect(")")
            return Call(name, argument)
        metric = self.take("name")
        if metric is None:
            raise self.fail("a metric name, e.g. steps_to(loss, 1.2)")
        self.expect(",")
        target = self.sum()
        self.expect(")")
        return Quantity("steps_to", metric.text, baseline, target)


def parse(text: str) -> Criterion:
    """The criterion `text`, parsed; CriterionError (an InputError) naming the column where it went wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("--expect: expected a criterion such as 'final.loss <= baseline.final.loss * 1.05'")
    if len(text) > MAX_LENGTH:
        raise CriterionError(text, MAX_LENGTH, f"at most {MAX_LENGTH} characters")
    if any(not c.isprintable() for c in text):
        spot = next(i for i, c in enumerate(text) if not c.isprintable())
        raise CriterionError(text, spot, "printable characters only")
    return _Parser(text).criterion()


# -- evaluation -------------------------------------------------------------------------------


class Missing(Exception):
    """A quantity the runs cannot give (a metric never logged, a run that has not ended)."""

    def __init__(self, quantity: Quantity, why: str) -> None:
        self.quantity = quantity
        self.why = why
        super().__init__(f"{quantity.text()}: {why}")


Lookup = Callable[[Quantity, Callable[[object], float]], float]


@dataclass(frozen=True)
class Outcome:
    """One criterion judged: `holds` is None when it could not be decided, with `missing` saying why."""

    criterion: str
    holds: bool | None
    left: float | None
    right: float | None
    values: dict[str, float]  # every quantity read, by its text: what a reader needs to check by hand
    missing: str | None = None

    def to_json(self) -> dict:
        return {"criterion": self.criterion, "holds": self.holds, "left": _plain(self.left), "right": _plain(self.right),
                "values": {k: _plain(v) for k, v in self.values.items()}, "missing": self.missing}


def evaluate(criterion: Criterion, lookup: Lookup) -> Outcome:
    """Judge `criterion`; `lookup(quantity, value_of)` gives a quantity's number or raises Missing."""
    values: dict[str, float] = {}

    def value_of(node: object) -> float:
        if isinstance(node, Number):
            return node.value
        if isinstance(node, Quantity):
            found = float(lookup(node, value_of))
            values[node.text()] = found
            return found
        if isinstance(node, Call):
            return abs(value_of(node.argument))
        if isinstance(node, Negate):
            return -value_of(node.operand)
        left, right = value_of(node.left), value_of(node.right)
        if node.op == "+":
            return left + right
        if node.op == "-":
            return left - right
        if node.op == "*":
            return left * right
        if right == 0:
            raise ZeroDivisionError(f"{node.right.text()} is 0")
        return left / right

    try:
        left = value_of(criterion.left)
        right = value_of(criterion.right)
    except Missing as exc:
        return Outcome(criterion.source, None, None, None, values, missing=str(exc))
    except ZeroDivisionError as exc:
        return Outcome(criterion.source, None, None, None, values, missing=f"division by zero: {exc}")
    return Outcome(criterion.source, _compare(criterion.op, left, right), left, right, values)


def _compare(op: str, left: float, right: float) -> bool:
    # A NaN (a diverged loss) satisfies nothing: the comparison is False, so the criterion fails.
    if op == "<=":
        return left <= right
    if op == ">=":
        return left >= right
    if op == "<":
        return left < right
    if op == ">":
        return left > right
    if op == "==":
        return math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-12)
    return not math.isclose(left, right, rel_tol=1e-9, abs_tol=1e-12)


def _plain(value: float | None) -> float | str | None:
    """A number JSON can hold: NaN and infinities as text."""
    if value is None or math.isfinite(value):
        return value
    return str(value)
