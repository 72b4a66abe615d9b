"""No constraint can hold the compiler (``minisgl/grammar/limits.py``, ``compiler.py``): what is refused
before anything compiles (size, depth, keywords xgrammar would ignore, each boundary exactly), and the
compile lanes with a backend whose compile takes as long as a test says: the time limit, a compile
nobody waits for stopped at once, a syntax error refused while both compile lanes are busy, no child
process left behind, the cache bounded in bytes. Every keyword ``limits.py`` lets through is one that
xgrammar's matcher enforces: a string it forbids is refused, one it allows accepted."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from minisgl.grammar.base import GrammarBackend, GrammarError, Matcher
from minisgl.grammar.compiler import Compiler
from minisgl.grammar.limits import MAX_BYTES, MAX_DEPTH, check, json_depth


# ---- limits: refused at once ------------------------------------------------------------------------
def test_the_size_limit_is_the_constraints_bytes():
    check("regex", "a" * MAX_BYTES)  # exactly at the limit: accepted
    with pytest.raises(GrammarError, match=f"{MAX_BYTES + 1:,} bytes; the limit is {MAX_BYTES:,} bytes"):
        check("regex", "a" * (MAX_BYTES + 1))
    with pytest.raises(GrammarError, match="the limit is"):  # UTF-8 bytes, not characters
        check("ebnf", "é" * (MAX_BYTES // 2 + 1))


def nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


def test_the_depth_limit():
    assert json_depth(nested(MAX_DEPTH)) == MAX_DEPTH and json_depth(5) == 0 and json_depth([[]]) == 2
    check("json_schema", json.dumps(nested(MAX_DEPTH)))
    with pytest.raises(GrammarError, match=f"nests {MAX_DEPTH + 1} levels deep; the limit is {MAX_DEPTH}"):
        check("json_schema", json.dumps(nested(MAX_DEPTH + 1)))
    with pytest.raises(GrammarError, match=f"deeper than {MAX_DEPTH} levels"):  # deeper than Python's stack
        check("json_schema", "[" * 30_000 + "]" * 30_000)
    assert json_depth(json.loads("[" * 900 + "]" * 900)) == 900  # measured without recursion


OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
REFUSED = [
    ({"not": {"type": "string"}}, "'not' is not supported"),
    ({"type": "string", "if": {"const": "x"}, "then": {"maxLength": 0}}, "'if' is not supported"),
    ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "'allOf' is not supported"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems' is not supported"),
    ({"type": "array", "contains": {"const": 5}}, "'contains' is not supported"),
    ({**OBJ, "dependentRequired": {"a": ["b"]}}, "'dependentRequired' is not supported"),
    ({"type": "string", "maxLenght": 3}, "'maxLenght' is not supported"),  # a typo is not ignored either
    ({"$ref": "http://example.com/s.json"}, "only references inside the schema"),
    ({"$ref": "file:///etc/passwd"}, "only references inside the schema"),
    ({"$defs": {"x": {"type": "integer"}}, "$ref": "#x"}, "only references inside the schema"),
    ({"$defs": {"x": {"$anchor": "x", "type": "integer"}}}, "json_schema at #/$defs/x: '$anchor' is not supported"),
    ({"type": "string", "maxLength": -1}, "'maxLength' must be a non-negative integer"),
    ({"type": "array", "minItems": 1.5}, "'minItems' must be a non-negative integer"),
    ({"type": "number", "multipleOf": 0.5}, "'multipleOf' needs \"type\": 'integer'"),
    ({"type": "string", "format": "iri"}, "format 'iri' is not supported"),
    ({"minimum": 3}, "'minimum' needs \"type\": 'integer' or 'number'"),
    ({"pattern": "^a$"}, "'pattern' needs \"type\": 'string'"),
    ({"type": "string", "anyOf": [{"maxLength": 1}, {"minLength": 3}]}, "anyOf/oneOf beside other keywords"),
    ({**OBJ, "required": ["c"]}, "required property 'c' is not in properties"),
    ({**OBJ, "required": ["c"], "additionalProperties": False}, "required property 'c' is not in properties"),
    ({"type": "object", "properties": {"a": {"not": {}}}}, "json_schema at #/properties/a: 'not'"),
    ({"type": "array", "items": {"type": "array", "items": {"uniqueItems": True}}}, "at #/items/items:"),
    ({"type": "object", "properties": []}, "'properties' must be an object"),
    ([1, 2], "a schema is an object or a boolean"),
]


@pytest.mark.parametrize("schema, words", REFUSED, ids=[w for _, w in REFUSED])
def test_what_xgrammar_would_ignore_is_refused_naming_it(schema, words):
    with pytest.raises(GrammarError) as e:
        check("json_schema", json.dumps(schema))
    assert str(e.value).startswith("json_schema at #") and words in str(e.value), str(e.value)


# (schema, a string the schema forbids, one it allows): each keyword limits.py accepts, enforced by xgrammar
ENFORCED = [
    ({"type": "integer", "minimum": 3}, "2", "3"),
    ({"type": "integer", "exclusiveMaximum": 3}, "3", "2"),
    ({"type": "number", "exclusiveMinimum": 1.5}, "1.5", "1.6"),
    ({"type": "integer", "multipleOf": 3}, "4", "6"),
    ({"type": "string", "minLength": 2}, '"a"', '"ab"'),
    ({"type": "string", "maxLength": 2}, '"abc"', '"ab"'),
    ({"type": "string", "pattern": "^a+$"}, '"b"', '"aa"'),
    ({"type": "string", "format": "date"}, '"nope"', '"2020-01-01"'),
    ({"type": "string", "format": "email"}, '"nope"', '"a@b.co"'),
    ({"type": "string", "format": "uuid"}, '"nope"', '"123e4567-e89b-12d3-a456-426614174000"'),
    ({"type": ["string", "null"], "maxLength": 1}, '"ab"', "null"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1}, "[]", "[1]"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 1}, "[1, 2]", "[1]"),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": False}, '["a", "b"]', '["a"]'),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False}, "[1, 2]", "[1]"),
    ({**OBJ, "required": ["a"]}, '{"b": 1}', '{"a": 1}'),
    ({**OBJ, "additionalProperties": {"type": "string"}}, '{"c": 1}', '{"c": "x"}'),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, '{"x": "s"}', '{"x": 1}'),
    ({"type": "object", "additionalProperties": True, "propertyNames": {"pattern": "^[a-c]$"}}, '{"z": 1}', '{"a": 1}'),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}, "{}", '{"a": 1}'),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, '{"a": 1, "b": 2}', "{}"),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}], "title": "t"}, "true", "1"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "true", "1"),
    ({"enum": ["a", 1]}, '"b"', "1"),
    ({"const": "a"}, '"b"', '"a"'),
    ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, '"a"', "1"),
    ({"type": "string", "description": "d", "default": "x", "examples": ["x"]}, "1", '"x"'),
]


@pytest.mark.parametrize("schema, bad, good", ENFORCED, ids=[json.dumps(s)[:60] for s, _, _ in ENFORCED])
def test_what_is_accepted_is_enforced(schema, bad, good):
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    text = json.dumps(schema)
    check("json_schema", text)
    grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False)
    assert not _is_grammar_accept_string(grammar, bad), f"{text} let {bad} through"
    assert _is_grammar_accept_string(grammar, good), f"{text} refused {good}"


# ---- the compile lanes ------------------------------------------------------------------------------
class SlowBackend(GrammarBackend):
    """Compiles "sleep N" in N seconds (a stand-in for a big schema), refuses "bad" in its syntax check."""

    def __init__(self):
        super().__init__(None, 8, [0])

    @classmethod
    def check(cls, kind: str, text: str) -> None:
        if text == "bad":
            raise GrammarError(f"invalid {kind}: bad")

    def compile(self, kind: str, text: str):
        time.sleep(float(text.split()[1]) if text.startswith("sleep") else 0)
        return {"compiled": text}

    def matcher(self, compiled) -> Matcher:
        raise NotImplementedError


_EARLIER: set[int] = set()  # children the test process had before this test (an earlier test's server, say)


@pytest.fixture(autouse=True)
def _count_only_this_tests_children():
    _EARLIER.clear()
    _EARLIER.update(p.pid for p in psutil.Process(os.getpid()).children())
    yield


def children() -> list[int]:
    """The live processes this test's compiles forked (not those an earlier test left running)."""
    return [
        p.pid
        for p in psutil.Process(os.getpid()).children()
        if p.pid not in _EARLIER and p.status() != psutil.STATUS_ZOMBIE
    ]


def test_a_compile_past_its_time_limit_is_refused_and_its_process_killed():
    # 2 s: the limit counts the fork too, and a fork of a test process of several GB took over 0.5 s in CI
    c = Compiler(SlowBackend, time_limit=2)
    t = time.monotonic()
    with pytest.raises(GrammarError, match=r"the regex took longer than 2 s to compile \(the limit\)"):
        c.submit(("regex", "sleep 60"), "req").result(timeout=30)
    assert time.monotonic() - t < 10 and wait_for(lambda: not children()), "the compile's process lives on"
    assert c.submit(("regex", "sleep 0"), "req").result(timeout=30) == {"compiled": "sleep 0"}
    with pytest.raises(GrammarError, match="took longer"):  # the refusal is cached: refused again at once
        c.submit(("regex", "sleep 60")).result(timeout=1)
    c.shutdown()


def test_a_compile_nobody_waits_for_stops_and_others_go_on():
    c = Compiler(SlowBackend, time_limit=600)
    slow = [c.submit(("regex", f"sleep 60 {i}"), f"client {i}") for i in range(2)]  # both compile lanes
    shared = c.submit(("regex", "sleep 60 shared"), "a")
    c.submit(("regex", "sleep 60 shared"), "b")
    assert wait_for(lambda: len(children()) == 2), children()
    t = time.monotonic()
    bad = c.submit(("regex", "bad"), "req")  # the syntax lane answers while both compile lanes are busy
    with pytest.raises(GrammarError, match="invalid regex: bad"):
        bad.result(timeout=5)
    for i, fut in enumerate(slow):
        c.drop(("regex", f"sleep 60 {i}"), f"client {i}")  # its client left
        with pytest.raises(GrammarError, match="no request waits for it"):
            fut.result(timeout=1)
    quick = c.submit(("regex", "sleep 0.1"), "req")
    assert quick.result(timeout=10) == {"compiled": "sleep 0.1"} and time.monotonic() - t < 10
    c.drop(("regex", "sleep 60 shared"), "a")  # one of two waiters left: it goes on
    assert not shared.done() and wait_for(lambda: len(children()) == 1)
    c.drop(("regex", "sleep 60 shared"), "b")
    assert wait_for(lambda: not children()), "a compile nobody waits for left its process behind"
    assert ("regex", "sleep 60 shared") not in c._jobs  # forgotten: asked again, it compiles again
    c.shutdown()


def test_the_cache_is_bounded_in_bytes_least_recently_used_first():
    class Sized(SlowBackend):
        def nbytes(self, compiled) -> int:
            return 400_000

    c = Compiler(Sized, cache_bytes=1_000_000)
    first = c.submit(("regex", "sleep 0 a"))
    first.result(timeout=30)
    for name in "bcd":
        c.submit(("regex", f"sleep 0 {name}")).result(timeout=30)
        assert c.submit(("regex", "sleep 0 a")) is first  # used again: kept
    assert c.cached_bytes <= 1_000_000 and len(c._jobs) == 2
    assert set(c._jobs) == {("regex", "sleep 0 a"), ("regex", "sleep 0 d")}
    c.shutdown()


FORK_AFTER_FREE = r"""
import os, torch
from minisgl.kvcache.pool import KVPool

def mapped(addr, pid="self"):
    for line in open(f"/proc/{pid}/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line.split()[-1] if len(line.split()) > 5 else "anonymous"
    return None

def fork_and_malloc():
    pid = os.fork()
    if pid == 0:  # what any child does first: allocate and free (CPython's after-fork clean-up does)
        junk = [bytes(1000) * (i % 50 + 1) for i in range(50_000)]
        os._exit(0 if junk else 1)
    return os.waitpid(pid, 0)[1]

t = torch.zeros(30 << 20, dtype=torch.uint8); del t  # glibc now serves blocks under 30 MiB from its heap
small = [torch.zeros(4 << 20, dtype=torch.uint8) for _ in range(40)]
pin = torch.zeros(1 << 20, dtype=torch.uint8)
del small  # 160 MiB free inside the heap: malloc would carve an 80 MiB block out of it
pool = KVPool(2, 150, 16, 8, 256, torch.float32, torch.device("cpu"))  # 76 MiB
addr = pool.buffer.data_ptr() + pool.buffer.nbytes // 2
assert mapped(addr) == "anonymous", mapped(addr)  # its own mapping, not [heap]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"absent" if mapped(addr) is None else b"present"); os._exit(0)
os.waitpid(pid, 0)
print("child sees the pool:", os.read(r, 16).decode())
del pool
assert mapped(addr) is None, "unmapped with the pool"
junk = [bytes(1000) * (i % 50 + 1) for i in range(50_000)]  # malloc reuses the freed space
print("fork after the pool was freed:", fork_and_malloc())
"""


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_a_fork_leaves_out_the_kv_pool_and_nothing_else(tmp_path):
    """The trial compile forks the scheduler's process; the fork leaves out the KV pool (its page tables
    are most of a fork's time), and nothing else: the pool lies in a mapping of its own, so a child forked
    once the pool's memory is free again still has all of malloc's heap (advising a ``torch.zeros``'s
    pages crashed every later fork's child once malloc had carved the pool out of free heap space)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FORK_AFTER_FREE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "child sees the pool: absent" in out.stdout, out.stdout
    assert "fork after the pool was freed: 0" in out.stdout, out.stdout


def wait_for(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()
