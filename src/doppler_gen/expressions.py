"""Dispatch and size expressions: a small whitelisted grammar, parsed when variants.toml loads.

A dispatch rule such as ``ceil(query_len / BLOCK_SIZE) * num_heads`` is written into the
manifest for hosts and evaluated by the runtime for every case. It used to be handed to Python's
``eval`` at validation time, so ``num_heads // 0``, ``[num_heads] * 3`` or ``9**9**8`` were
accepted by ``generate`` and crashed or hung ``validate`` later. Here it is parsed once, at load
time, by a recursive-descent parser that accepts only this grammar::

    expression := term (("+" | "-") term)*
    term       := unary (("*" | "/") unary)*
    unary      := "-" unary | atom
    atom       := INTEGER | NAME | FUNCTION "(" expression ("," expression)* ")"
                | "(" expression ")"
    FUNCTION   := ceil (one argument) | min | max (two or more)

Semantics (documented in README, "Expressions"):

* Values are exact rationals: ``/`` divides exactly and never rounds by itself. ``ceil(a / b)``
  is the integer ceiling division a workgroup count needs (the host writes the same as
  ``Math.ceil(a / b)``).
* A workgroup count must be a whole number, so every division must sit under a ``ceil()``. That
  is checked statically, at load: ``num_heads / 3`` is rejected there, not blamed on the kernel
  by ``validate``.
* Sizes are bounded: integer literals up to 2^32 - 1, intermediate values up to 2^53 in
  magnitude, at most 256 characters and nesting depth 16. A divisor that is a constant zero is
  rejected at load; one that is zero for a given case is an error at evaluation.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from doppler_gen.errors import DopplerGenError

MAX_LENGTH = 256
MAX_DEPTH = 16
MAX_LITERAL = 2**32 - 1
MAX_MAGNITUDE = 2**53
FUNCTIONS = {"ceil": (1, 1), "min": (2, 8), "max": (2, 8)}

# ASCII only: a host parses these rules too, and JavaScript's digits are 0-9 (Python's \d
# and str.isdigit() also take other scripts' digits, such as U+0661)
_TOKEN = re.compile(
    r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*/(),]))", re.ASCII
)
_BLANK = " \t\n\r\f\v"


class ExpressionError(DopplerGenError):
    """An expression outside the grammar, or one that cannot be evaluated for given values."""


@dataclass(frozen=True)
class Node:
    """One node of a parsed expression: ``kind`` is int, name, neg, + - * /, ceil, min, max."""

    kind: str
    value: int | str | None = None
    args: tuple[Node, ...] = ()

    @property
    def whole(self) -> bool:
        """Whether the node's value is an integer for every input (``/`` only under ceil)."""
        if self.kind in ("int", "name", "ceil"):
            return True
        if self.kind == "/":
            return False
        return all(arg.whole for arg in self.args)


@dataclass(frozen=True)
class Expression:
    """A parsed expression: its source text, syntax tree and the names it reads."""

    text: str
    tree: Node
    names: frozenset[str]

    def evaluate(self, values: Mapping[str, int | float]) -> int:
        """The integer value for ``values`` (every name must be given, as a whole number)."""
        missing = sorted(self.names - set(values))
        if missing:
            raise ExpressionError(
                f"expression {self.text!r} uses unknown names {', '.join(missing)} (no value given)"
            )
        result = _evaluate(self.tree, values, self.text)
        if result.denominator != 1:  # unreachable for a whole tree; kept as a guard
            raise ExpressionError(f"expression {self.text!r} is not a whole number ({result})")
        return int(result)


def parse(text: str, *, what: str = "expression") -> Expression:
    """Parse ``text``; ExpressionError (with ``what`` in the message) for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(f"{what} must be a non-empty expression")
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"{what} is longer than {MAX_LENGTH} characters")
    tokens = _tokenize(text, what)
    parser = _Parser(tokens, text, what)
    tree = parser.expression(0)
    if parser.position < len(tokens):
        raise parser.error(f"unexpected {tokens[parser.position]!r}")
    _check_constant_divisors(tree, text, what)
    if not tree.whole:
        raise ExpressionError(
            f"{what} {text!r}: a division outside ceil() may not give a whole number; "
            "round it explicitly, e.g. ceil(a / b)"
        )
    return Expression(text, tree, frozenset(_names(tree)))


def _tokenize(text: str, what: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    stripped = text.rstrip(_BLANK)
    while position < len(stripped):
        match = _TOKEN.match(stripped, position)
        if match is None:
            bad = stripped[position:].lstrip(_BLANK)[:1]
            raise ExpressionError(
                f"{what} {text!r}: {bad!r} is not allowed (only integers, names, + - * /, "
                "ceil(), min(), max() and parentheses)"
            )
        tokens.append(match.group().strip())
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over the token list; depth-bounded so input cannot blow the stack."""

    def __init__(self, tokens: list[str], text: str, what: str) -> None:
        self.tokens = tokens
        self.text = text
        self.what = what
        self.position = 0

    def error(self, message: str) -> ExpressionError:
        return ExpressionError(f"{self.what} {self.text!r}: {message}")

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("ends too early")
        self.position += 1
        return token

    def expect(self, token: str) -> None:
        got = self.peek()
        if got != token:
            raise self.error(f"expected {token!r}, got {got!r}" if got else f"missing {token!r}")
        self.position += 1

    def expression(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH}")
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            node = Node(self.take(), args=(node, self.term(depth)))
        return node

    def term(self, depth: int) -> Node:
        node = self.unary(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            if self.peek() in ("*", "/"):  # `**` and `//` are Python, not this grammar
                raise self.error(f"{op}{self.peek()} is not an operator here")
            node = Node(op, args=(node, self.unary(depth)))
        return node

    def unary(self, depth: int) -> Node:
        if self.peek() == "-":
            self.take()
            if depth + 1 > MAX_DEPTH:
                raise self.error(f"nested deeper than {MAX_DEPTH}")
            return Node("neg", args=(self.unary(depth + 1),))
        return self.atom(depth)

    def atom(self, depth: int) -> Node:
        token = self.take()
        if token.isascii() and token.isdigit():
            value = int(token)
            if value > MAX_LITERAL:
                raise self.error(f"integer {token} is larger than {MAX_LITERAL}")
            return Node("int", value)
        if token == "(":
            node = self.expression(depth + 1)
            self.expect(")")
            return node
        if re.fullmatch(r"[A-Za-z_]\w*", token):
            if self.peek() != "(":
                if token in FUNCTIONS:
                    raise self.error(f"{token} must be called: {token}(...)")
                return Node("name", token)
            return self.call(token, depth)
        raise self.error(f"unexpected {token!r}")

    def call(self, name: str, depth: int) -> Node:
        if name not in FUNCTIONS:
            raise self.error(f"unknown function {name}() (known: {', '.join(FUNCTIONS)})")
        self.expect("(")
        args = [self.expression(depth + 1)]
        while self.peek() == ",":
            self.take()
            args.append(self.expression(depth + 1))
        self.expect(")")
        low, high = FUNCTIONS[name]
        if not low <= len(args) <= high:
            count = f"{low}" if low == high else f"{low} to {high}"
            raise self.error(f"{name}() takes {count} argument(s), got {len(args)}")
        return Node(name, args=tuple(args))


def _names(node: Node) -> set[str]:
    if node.kind == "name":
        return {str(node.value)}
    return set().union(*(_names(arg) for arg in node.args)) if node.args else set()


def _check_constant_divisors(node: Node, text: str, what: str) -> None:
    """Reject a divisor that is zero whatever the inputs (``x / 0``, ``x / (2 - 2)``)."""
    for arg in node.args:
        _check_constant_divisors(arg, text, what)
    divisor = node.args[1] if node.kind == "/" else None
    if divisor is not None and not _names(divisor) and _evaluate(divisor, {}, text) == 0:
        raise ExpressionError(f"{what} {text!r}: division by zero")


def _evaluate(node: Node, values: Mapping[str, int | float], text: str) -> Fraction:
    result = _apply(node, values, text)
    if abs(result) > MAX_MAGNITUDE:
        raise ExpressionError(f"expression {text!r}: a value exceeds 2^53 ({float(result):.3g})")
    return result


def _apply(node: Node, values: Mapping[str, int | float], text: str) -> Fraction:
    if node.kind == "int":
        return Fraction(int(node.value or 0))
    if node.kind == "name":
        return _whole(str(node.value), values[str(node.value)], text)
    args = [_evaluate(arg, values, text) for arg in node.args]
    if node.kind == "neg":
        return -args[0]
    if node.kind == "+":
        return args[0] + args[1]
    if node.kind == "-":
        return args[0] - args[1]
    if node.kind == "*":
        return args[0] * args[1]
    if node.kind == "/":
        if args[1] == 0:
            raise ExpressionError(f"expression {text!r}: division by zero for these values")
        return args[0] / args[1]
    if node.kind == "ceil":
        return Fraction(math.ceil(args[0]))
    if node.kind == "min":
        return min(args)
    if node.kind == "max":
        return max(args)
    raise AssertionError(f"unknown node {node.kind}")  # the parser builds no other kind


def _whole(name: str, value: int | float, text: str) -> Fraction:
    """A name's value: a finite whole number (uniform fields and sizes are integers)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ExpressionError(f"expression {text!r}: {name} = {value!r} is not a number")
    if not isinstance(value, numbers.Integral):
        number = float(value)
        if not math.isfinite(number) or not number.is_integer():
            raise ExpressionError(f"expression {text!r}: {name} = {value!r} is not a whole number")
    whole = int(value)
    if abs(whole) > MAX_MAGNITUDE:
        raise ExpressionError(f"expression {text!r}: {name} = {whole} exceeds 2^53")
    return Fraction(whole)
