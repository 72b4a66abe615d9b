"""Constraints for tool calls (``minisgl/toolcall/`` renders and parses them): the output is made of
calls whose JSON names one of the request's functions and whose arguments follow that function's
``parameters`` schema, so a returned call always parses and validates. ::

    hermes, required / a named function:  <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>
                                           (then "\\n" and another block, with parallel_tool_calls)
    hermes, auto:                          any text; once it writes "<tool_call>", the same block
    llama3, required / named:              {"name": "f", "parameters": {...}}
    llama3, auto:                          no constraint (the call is parsed if the whole answer is one)

The call's JSON is compiled without free whitespace, as ``response_format`` is (``xgrammar_backend``),
and the blocks around it are xgrammar's structural tags; the result is one EBNF text (the request's
``ebnf``): the same compile path, cache and limits as any other constraint.
"""

from __future__ import annotations

import json
from typing import Any

from minisgl.grammar.base import GrammarError
from minisgl.grammar.limits import check

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def args_key(fmt: str) -> str:
    """The key holding a call's arguments: Llama 3.x writes ``parameters``, Hermes/Qwen ``arguments``."""
    return "parameters" if fmt == "llama3" else "arguments"


def call_schema(tools: list[dict[str, Any]], fmt: str) -> dict[str, Any]:
    """The JSON schema of one call to any of ``tools`` (OpenAI's ``{"type": "function", "function": ...}``).
    Each function's ``parameters`` becomes ``$defs/f<i>`` (its own ``$defs`` hoisted beside it as
    ``f<i>.<name>``), its ``$ref``s rewritten: they point into the schema they came from."""
    key, defs, cases = args_key(fmt), {}, []
    for i, t in enumerate(tools):
        params = dict(t["function"].get("parameters") or {"type": "object", "properties": {}})  # none: no arguments
        own = {**params.pop("definitions", {}), **params.pop("$defs", {})}
        fix = _refs(f"f{i}")
        defs |= {f"f{i}.{name}": fix(d) for name, d in own.items()} | {f"f{i}": fix(params)}
        props = {"name": {"const": t["function"]["name"]}, key: {"$ref": f"#/$defs/f{i}"}}
        cases.append({"type": "object", "properties": props, "required": ["name", key]})
    return {"anyOf": cases, "$defs": defs} if len(cases) > 1 else {**cases[0], "$defs": defs}


def _refs(name: str):
    def fix(v: Any) -> Any:
        if isinstance(v, list):
            return [fix(x) for x in v]
        if not isinstance(v, dict):
            return v
        out = {k: fix(x) for k, x in v.items()}
        ref = v.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            for head in ("#/$defs/", "#/definitions/"):
                if ref.startswith(head):
                    out["$ref"] = f"#/$defs/{name}.{ref[len(head) :]}"
                    break
            else:
                out["$ref"] = f"#/$defs/{name}{ref[1:]}"
        return out

    return fix


def check_parameters(parameters: dict[str, Any]) -> None:
    """``GrammarError`` if a function's ``parameters`` is not a schema the engine can enforce."""
    from minisgl.grammar.xgrammar_backend import XGrammarBackend

    text = json.dumps(parameters)
    try:
        check("json_schema", text)
    except (TypeError, AttributeError) as e:  # a keyword whose value has the wrong type ("properties": 5)
        raise GrammarError(f"not a valid JSON schema ({type(e).__name__}: {e})") from None
    XGrammarBackend.check("json_schema", text)


def tool_grammar(tools: list[dict[str, Any]], choice: str | dict, parallel: bool, fmt: str) -> str | None:
    """The EBNF the output must follow for ``tool_choice`` = ``choice`` (``"auto"``, ``"required"`` or
    ``{"type": "function", "function": {"name": ...}}``); None: the output is free."""
    import xgrammar as xgr

    if isinstance(choice, dict):
        tools = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    if choice == "none" or not tools or (fmt == "llama3" and choice == "auto"):
        return None
    call = str(xgr.Grammar.from_json_schema(json.dumps(call_schema(tools, fmt)), any_whitespace=False))
    if fmt == "llama3":
        return call
    tag = {"type": "tag", "begin": OPEN + "\n", "content": {"type": "grammar", "grammar": call}, "end": "\n" + CLOSE}
    if choice == "auto":
        fmt_ = {"type": "triggered_tags", "triggers": [OPEN], "tags": [tag], "stop_after_first": not parallel}
    else:  # required, or a named function: at least one block
        fmt_ = {"type": "tags_with_separator", "tags": [tag], "separator": "\n", "at_least_one": True,
                "stop_after_first": not parallel}  # fmt: skip
    return str(xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt_})))
