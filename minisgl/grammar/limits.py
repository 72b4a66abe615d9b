"""What a constraint may be, checked before anything compiles (the scheduler's ``make_request``, so
``LLM`` and the server refuse alike, at once): its size, how deep its JSON nests, and, for a JSON
schema, that every keyword in it is one the engine's backend (xgrammar 0.2) enforces.

xgrammar ignores what it does not implement: ``not``, ``allOf``, ``uniqueItems``, ``contains``,
``dependentRequired``, a remote ``$ref`` (read as any JSON), ``maxLength: -1``, a ``format`` it does not
know, ``minimum`` on a schema with no numeric ``type``; and a ``required`` property that ``properties``
does not declare while additional ones are forbidden gives ``{}``, which breaks the schema. A client
that asked for any of these would get output that does not follow its schema, so they are refused, each
named with its place in the schema. What is accepted was checked against xgrammar's matcher
(``tests/test_grammar_limits.py``: a string the keyword forbids is refused, one it allows is accepted).
"""

from __future__ import annotations

import json
from typing import Any

from minisgl.grammar.base import GrammarError

MAX_BYTES = 64 << 10  # a constraint's text, in UTF-8 bytes (what compiles in seconds: docs/structured-output.md)
MAX_DEPTH = 64  # nested JSON arrays and objects in a schema (OpenAI allows 10 levels of objects)

ANNOTATIONS = set("$schema $id $comment title description default examples deprecated readOnly writeOnly".split())
# keyword -> the "type" it needs (None: any schema)
TYPED = {
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"), ("integer", "number")),
    "multipleOf": ("integer",),  # xgrammar ignores it on numbers
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), ("string",)),
    **dict.fromkeys(("minItems", "maxItems"), ("array",)),
    **dict.fromkeys(("minProperties", "maxProperties"), ("object",)),
}
SUB = {"items", "additionalItems", "unevaluatedItems", "additionalProperties", "unevaluatedProperties", "propertyNames"}
SUB_LISTS = {"prefixItems", "anyOf", "oneOf"}
SUB_MAPS = {"properties", "patternProperties", "$defs", "definitions"}
KNOWN = ANNOTATIONS | set(TYPED) | SUB | SUB_LISTS | SUB_MAPS | {"type", "enum", "const", "required", "$ref"}
COUNTS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
FORMATS = set(
    "date time date-time duration email hostname ipv4 ipv6 uri uri-reference uri-template uuid json-pointer "
    "relative-json-pointer".split()
)


def check(kind: str, text: str) -> None:
    """Raise ``GrammarError`` saying what to change if constraint ``text`` (of ``kind``) is too big, or
    a JSON schema that nests too deep, is not JSON, or asks for what the backend would ignore."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise GrammarError(f"the {kind} is {size:,} bytes; the limit is {MAX_BYTES:,} bytes")
    if kind != "json_schema":
        return
    try:
        schema = json.loads(text)
    except RecursionError:  # deeper than Python's stack: deeper than MAX_DEPTH in any case
        raise GrammarError(f"the json_schema nests deeper than {MAX_DEPTH} levels (the limit)") from None
    except ValueError as e:
        raise GrammarError(f"invalid json_schema: not JSON ({e})") from None
    if (depth := json_depth(schema)) > MAX_DEPTH:
        raise GrammarError(f"the json_schema nests {depth} levels deep; the limit is {MAX_DEPTH}")
    check_schema(schema)


def json_depth(value: Any) -> int:
    """How many arrays and objects nest in ``value`` (``1`` for ``{}``, ``0`` for a number); iterative,
    so a value nested thousands deep is measured, not a ``RecursionError``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack += [(c, d + 1) for c in (v.values() if isinstance(v, dict) else v)]
    return deepest


def check_schema(schema: Any, path: str = "#", implied: tuple[str, ...] = ()) -> None:
    """Raise ``GrammarError`` naming the first keyword (and where) that xgrammar would not enforce.
    ``implied``: the types the place implies (a ``propertyNames`` schema is a string's)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema at {path}: a schema is an object or a boolean, got {type(schema).__name__}")
    bad = lambda why: GrammarError(f"json_schema at {path}: {why}")  # noqa: E731
    types = schema.get("type", ())
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set(implied)
    for key, value in schema.items():
        if key not in KNOWN:
            raise bad(f"{key!r} is not supported (the output would not follow it)")
        if key in TYPED and not types & set(TYPED[key]):
            need = " or ".join(map(repr, TYPED[key]))
            raise bad(f'{key!r} needs "type": {need} beside it (otherwise it is ignored)')
        if key in COUNTS and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise bad(f"{key!r} must be a non-negative integer, got {value!r}")
    if "multipleOf" in schema and not (isinstance(schema["multipleOf"], int) and schema["multipleOf"] > 0):
        raise bad(f"'multipleOf' must be a positive integer, got {schema['multipleOf']!r}")
    if "format" in schema and schema["format"] not in FORMATS:
        raise bad(f"format {schema['format']!r} is not supported; supported: {', '.join(sorted(FORMATS))}")
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))):
        raise bad(f'$ref {ref!r}: only references inside the schema ("#/...") are supported')
    if ("anyOf" in schema or "oneOf" in schema) and set(schema) - ANNOTATIONS - SUB_MAPS - {"anyOf", "oneOf"}:
        raise bad("anyOf/oneOf beside other keywords is not supported: put those keywords inside each branch")
    declared = set(schema.get("properties") or {})
    closed = "properties" in schema and schema.get("additionalProperties", False) is False
    missing = [r for r in schema.get("required") or [] if r not in declared]
    if closed and not schema.get("patternProperties") and missing:
        raise bad(f"required property {missing[0]!r} is not in properties, and no other property is allowed")
    for key in SUB & set(schema):
        check_schema(schema[key], f"{path}/{key}", ("string",) if key == "propertyNames" else ())
    for key in SUB_LISTS & set(schema):
        for i, sub in enumerate(schema[key] if isinstance(schema[key], list) else [schema[key]]):
            check_schema(sub, f"{path}/{key}/{i}")
    for key in SUB_MAPS & set(schema):
        if not isinstance(schema[key], dict):
            raise bad(f"{key!r} must be an object")
        for name, sub in schema[key].items():
            check_schema(sub, f"{path}/{key}/{name}")
