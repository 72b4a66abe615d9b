"""A small regex -> DFA compiler over **bytes** (lesson 14 and lab 14 build token masks on it).

A byte-level BPE tokenizer's tokens are byte strings, and one token may end in the middle of a UTF-8
character, so the automaton reads UTF-8 bytes, not characters: ``é`` is the two transitions ``0xC3
0xA9``, and ``.`` is "one ASCII byte but newline, or one whole multi-byte UTF-8 sequence"::

    compile_regex(r"\\d{3}")   state 0 -[0-9]-> 1 -[0-9]-> 2 -[0-9]-> 3 (accepting); any other byte: DEAD

The subset it understands (the whole regex must match, as ``re.fullmatch``; a leading ``^`` and a
trailing ``$`` are allowed and mean nothing more): literals (any Unicode character), ``.``, classes
``[a-z0-9_]`` and ``[^...]`` (ranges of ASCII characters; a negated class admits every non-ASCII
character), the escapes ``\\d \\w \\s \\D \\W \\S`` (ASCII meanings: ``\\d`` is ``[0-9]``) and
``\\n \\t \\r`` and an escaped punctuation character, groups ``(...)`` and ``(?:...)``, alternation
``|``, and the greedy quantifiers ``* + ? {n} {n,} {n,m}``. Anything else raises ``GrammarError``
naming it. The DFA is not minimised; every state it has can still reach an accepting state (the
construction keeps no trap state besides ``DEAD``).
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.grammar.base import GrammarError

DEAD = -1  # the state after a byte the regex cannot take: no string through it is in the language
MAX_STATES = 4096
_ALL = frozenset(range(256))
_ASCII = frozenset(range(128))
_DIGIT = frozenset(b"0123456789")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SPACE = frozenset(b" \t\n\r\f\v")
_CONT = frozenset(range(0x80, 0xC0))  # a UTF-8 continuation byte


@dataclass(frozen=True)
class DFA:
    """``table[state][byte]`` is the next state (``DEAD`` if the byte is not allowed there);
    states are ``0 .. num_states - 1``, ``start`` is 0, and ``accepting`` holds the states where
    the input read so far is a whole match."""

    pattern: str
    table: tuple[tuple[int, ...], ...]
    accepting: frozenset[int]
    start: int = 0

    @property
    def num_states(self) -> int:
        return len(self.table)

    def step(self, state: int, byte: int) -> int:
        """The state after ``byte`` from ``state`` (a live state: ``0 <= state < num_states``)."""
        return self.table[state][byte]


# ---- parsing: regex text -> a tree of byte sets -------------------------------------------------
# ("set", frozenset of bytes) | ("seq", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi or None)
def _utf8(ch: str):
    return ("seq", [("set", frozenset([b])) for b in ch.encode("utf-8")])


def _any_multibyte():
    lead = lambda lo, hi: ("set", frozenset(range(lo, hi + 1)))  # noqa: E731
    cont = ("set", _CONT)
    return ("alt", [("seq", [lead(0xC2, 0xDF), cont]), ("seq", [lead(0xE0, 0xEF), cont, cont]),
                    ("seq", [lead(0xF0, 0xF4), cont, cont, cont])])  # fmt: skip


def _ascii_or_more(ascii_set: frozenset, multibyte: bool):
    node = ("set", frozenset(ascii_set))
    return ("alt", [node, _any_multibyte()]) if multibyte else node


_CLASS_ESCAPES = {"d": (_DIGIT, False), "w": (_WORD, False), "s": (_SPACE, False)}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, what: str) -> GrammarError:
        return GrammarError(f"invalid regex: {what} at position {self.pos} of {self.text!r}")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self) -> str:
        ch = self.peek()
        if ch is None:
            raise self.error("unexpected end")
        self.pos += 1
        return ch

    def parse(self):
        if self.peek() == "^":
            self.pos += 1
        node = self.alternation()
        if self.peek() == "$" and self.pos == len(self.text) - 1:
            self.pos += 1
        if self.pos != len(self.text):
            raise self.error(f"unexpected {self.peek()!r}")
        return node

    def alternation(self):
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self):
        items = []
        while self.peek() not in (None, "|", ")"):
            if self.peek() == "$" and self.pos == len(self.text) - 1:
                break
            items.append(self.quantified(self.atom()))
        return ("seq", items)

    def number(self) -> int | None:
        start = self.pos
        while self.peek() is not None and self.peek().isdigit():
            self.pos += 1
        return int(self.text[start : self.pos]) if self.pos > start else None

    def quantified(self, node):
        while self.peek() in ("*", "+", "?", "{"):
            ch = self.take()
            if ch == "*":
                node = ("rep", node, 0, None)
            elif ch == "+":
                node = ("rep", node, 1, None)
            elif ch == "?":
                node = ("rep", node, 0, 1)
            else:
                lo = self.number()
                if lo is None:
                    raise self.error("a number after '{'")
                hi: int | None = lo
                if self.peek() == ",":
                    self.pos += 1
                    hi = self.number()
                if self.take() != "}" or (hi is not None and hi < lo):
                    raise self.error("a bad {n,m} quantifier")
                node = ("rep", node, lo, hi)
            if self.peek() == "?":
                raise self.error("lazy quantifiers are not supported")
        return node

    def atom(self):
        ch = self.take()
        if ch == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                raise self.error("only (?:...) groups are supported")
            node = self.alternation()
            if self.peek() != ")":
                raise self.error("an unclosed '('")
            self.pos += 1
            return node
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return _ascii_or_more(_ASCII - {ord("\n")}, True)
        if ch == "\\":
            return self.escape(in_class=False)
        if ch in "*+?{":
            raise self.error(f"nothing to repeat before {ch!r}")
        if ch in ")^$":
            raise self.error(f"unsupported {ch!r}")
        return _utf8(ch)

    def escape(self, in_class: bool):
        ch = self.take()
        if ch.lower() in _CLASS_ESCAPES:
            chars, _ = _CLASS_ESCAPES[ch.lower()]
            return ("set", chars) if ch.islower() else _ascii_or_more(_ASCII - chars, True)
        if ch in _CHAR_ESCAPES:
            return _utf8(_CHAR_ESCAPES[ch])
        if ch.isalnum():
            raise self.error(f"unsupported escape \\{ch}")
        return _utf8(ch)

    def class_char(self) -> str | frozenset:
        ch = self.take()
        if ch != "\\":
            return ch
        esc = self.take()
        if esc.lower() in _CLASS_ESCAPES and esc.islower():
            return _CLASS_ESCAPES[esc][0]
        if esc in _CHAR_ESCAPES:
            return _CHAR_ESCAPES[esc]
        if esc.isalnum():
            raise self.error(f"unsupported escape \\{esc} in a class")
        return esc

    def char_class(self):
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ascii_set: set[int] = set()
        wide: list[str] = []
        first = True
        while first or self.peek() != "]":
            first = False
            item = self.class_char()
            if isinstance(item, frozenset):
                ascii_set |= item
                continue
            if self.peek() == "-" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] != "]":
                self.pos += 1
                hi = self.class_char()
                if isinstance(hi, frozenset) or ord(hi) < ord(item):
                    raise self.error("a bad range in a class")
                if ord(hi) > 127:
                    raise self.error("ranges of non-ASCII characters are not supported")
                ascii_set |= set(range(ord(item), ord(hi) + 1))
            elif ord(item) < 128:
                ascii_set.add(ord(item))
            else:
                wide.append(item)
        self.pos += 1  # the closing ]
        if negate:
            if wide:
                raise self.error("a negated class with non-ASCII characters is not supported")
            return _ascii_or_more(_ASCII - ascii_set, True)
        options = [("set", frozenset(ascii_set))] if ascii_set else []
        return ("alt", options + [_utf8(ch) for ch in wide]) if wide else options[0]


# ---- tree -> NFA (Thompson) -> DFA (subsets) -------------------------------------------------------
class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[frozenset, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node, start: int) -> int:
        """Connect ``node`` from ``start``; returns its end state."""
        kind = node[0]
        if kind == "set":
            end = self.state()
            self.edges[start].append((node[1], end))
            return end
        if kind == "seq":
            for item in node[1]:
                start = self.build(item, start)
            return start
        if kind == "alt":
            end = self.state()
            for item in node[1]:
                s = self.state()
                self.eps[start].append(s)
                self.eps[self.build(item, s)].append(end)
            return end
        _, inner, lo, hi = node
        for _ in range(lo):
            start = self.build(inner, start)
        end = self.state()
        self.eps[start].append(end)
        if hi is None:  # loop: inner any number of times more
            s = self.state()
            self.eps[start].append(s)
            back = self.build(inner, s)
            self.eps[back].append(s)
            self.eps[back].append(end)
            return end
        for _ in range(hi - lo):
            s = self.state()
            self.eps[start].append(s)
            start = self.build(inner, s)
            self.eps[start].append(end)
        return end

    def closure(self, states) -> frozenset[int]:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


def compile_regex(pattern: str) -> DFA:
    """The byte-level DFA of ``pattern`` (the subset in this module's docstring); ``GrammarError``
    naming the problem for anything else."""
    tree = _Parser(pattern).parse()
    nfa = _NFA()
    start = nfa.state()
    final = nfa.build(tree, start)
    first = nfa.closure([start])
    ids, order, table = {first: 0}, [first], []
    while len(table) < len(order):
        subset = order[len(table)]
        moves: dict[int, set[int]] = {}
        for s in subset:
            for chars, t in nfa.edges[s]:
                for b in chars:
                    moves.setdefault(b, set()).add(t)
        row = [DEAD] * 256
        for b, targets in moves.items():
            nxt = nfa.closure(targets)
            if nxt not in ids:
                if len(order) >= MAX_STATES:
                    raise GrammarError(f"invalid regex: {pattern!r} needs more than {MAX_STATES} DFA states")
                ids[nxt] = len(order)
                order.append(nxt)
            row[b] = ids[nxt]
        table.append(tuple(row))
    accepting = frozenset(i for i, subset in enumerate(order) if final in subset)
    return DFA(pattern, tuple(table), accepting)


# ---- the tokenizer's side: a byte-level BPE token's text -> its bytes -----------------------------
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte (byte-level
    BPE vocabularies, SmolLM2's, Qwen's and Llama-3's, spell a token's bytes with it: ``Ġ`` is a space)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


BYTE_DECODER = _byte_decoder()
