"""Tool calls and reasoning in the OpenAI-compatible chat API (``minisgl/toolcall/``,
``minisgl/grammar/tools.py``): the splitter on its own (streamed in any pieces, it gives what the whole
text gives), the default prompt rendering, the constraint (a call it accepts parses and validates,
one that breaks the schema is refused), then a server on the embedded model driven by the real
clients: the openai SDK's ``parse`` with ``pydantic_function_tool``, LangChain's ``bind_tools`` in an
agent loop, streamed and whole tool calls, ``tool_choice="none"``, reasoning, and the 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest
from server_utils import ServerProcess

from minisgl.toolcall import ChatOutput, OutputSplitter, chat_traits, render_chat

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


def stream_in_pieces(out: ChatOutput, text: str, size: int) -> dict:
    """The deltas of ``text`` fed ``size`` characters at a time, gathered as a client would."""
    got: dict = {"reasoning_content": "", "content": "", "calls": {}}
    pieces = [text[i : i + size] for i in range(0, len(text), size)] + [""]
    for k, piece in enumerate(pieces):
        for d in out.deltas(piece, k == len(pieces) - 1):
            for key in ("reasoning_content", "content"):
                got[key] += d.get(key, "")
            for c in d.get("tool_calls", ()):
                slot = got["calls"].setdefault(c["index"], {"name": "", "arguments": ""})
                slot["name"] += c.get("function", {}).get("name", "")
                slot["arguments"] += c["function"]["arguments"]
    return got


@pytest.mark.parametrize(
    "text",
    [
        "<think>plan it</think>\n\nSure. " + CALL + "\n" + CALL.replace("Paris", "Rome"),
        "no call here, only a < sign and <tool",
        "Cut short: " + CALL[:40],
    ],
)
def test_streamed_pieces_give_what_the_whole_text_gives(text):
    whole = ChatOutput("hermes", {"get_weather"}, think=True).message(text)
    for size in (1, 2, 3, 7, len(text)):
        got = stream_in_pieces(ChatOutput("hermes", {"get_weather"}, think=True), text, size)
        calls = [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in whole.get("tool_calls", [])
        ]
        assert [got["calls"][i] for i in sorted(got["calls"])] == calls, f"pieces of {size}"
        assert got["reasoning_content"] == whole.get("reasoning_content", ""), f"pieces of {size}"
        assert got["content"].strip() == (whole["content"] or "").strip(), f"pieces of {size}"


def test_splitter_formats():
    msg = ChatOutput("hermes", {"get_weather"}, think=True).message("<think>a</think>\n\nSure. " + CALL + "\n" + CALL)
    assert msg["reasoning_content"] == "a" and msg["content"] == "Sure." and len(msg["tool_calls"]) == 2
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    only = ChatOutput("hermes", {"get_weather"}).message(CALL)
    assert only["content"] is None and only["tool_calls"][0]["id"].startswith("call_")
    llama = ChatOutput("llama3", {"get_weather"}).message('{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    assert llama["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    # a function not offered, a cut block, and tool_choice none (no names): text, as written
    assert ChatOutput("hermes", {"other"}).message(CALL) == {"role": "assistant", "content": CALL}
    assert ChatOutput("hermes", {"get_weather"}).message(CALL[:30])["content"] == CALL[:30]
    assert OutputSplitter("hermes", set()).feed("<think>x</think>y", final=True).content == "<think>x</think>y"


def test_default_rendering_and_unchanged_chats(embedded_path):
    from minisgl.tokenizer import apply_chat_template, load_tokenizer

    tok = load_tokenizer(embedded_path)
    assert chat_traits(tok) == {"tool_format": "hermes", "native_tools": False, "thinks": False}
    assert render_chat(tok, ASK, None) == (ASK, None)  # no tools: the template gets the chat as before
    history = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "content": "18 C and sunny", "tool_call_id": "c1"},
    ]  # fmt: skip
    msgs, tools = render_chat(tok, history, TOOLS)
    text = tok.decode(apply_chat_template(tok, msgs, tools))
    assert tools is None and msgs[0]["role"] == "system" and '"name": "get_weather"' in msgs[0]["content"]
    assert CALL in text and "<tool_response>\n18 C and sunny\n</tool_response>" in text


def test_templates_with_tool_support_get_the_tools(embedded_path):
    from minisgl.tokenizer import apply_chat_template, load_tokenizer

    tok = load_tokenizer(embedded_path)
    tok.chat_template = (  # a Hermes-style template that renders tools and calls (arguments as a dict)
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
        "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
        "{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
    )
    assert chat_traits(tok) == {"tool_format": "hermes", "native_tools": True, "thinks": False}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    msgs, tools = render_chat(tok, ASK + [{"role": "assistant", "content": "", "tool_calls": [call]}], TOOLS)
    text = tok.decode(apply_chat_template(tok, msgs, tools))
    assert tools == TOOLS and "<tools>get_weather;</tools>" in text
    assert '"arguments": {"city": "Oslo"}' in text  # a dict, as templates expect, not the client's JSON string
    tok.chat_template = '{{ tools }} {{ \'{"name": function name, "parameters": dictionary}\' }}'  # Llama 3.x's
    assert chat_traits(tok)["tool_format"] == "llama3"


@pytest.fixture(scope="module")
def accepts(embedded_path):
    """``accepts(ebnf, text)``: the grammar reads the whole text and may end there."""
    import xgrammar as xgr

    from minisgl.tokenizer import load_tokenizer

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(load_tokenizer(embedded_path)), max_threads=1)

    def accepts(ebnf: str, text: str) -> bool:
        m = xgr.GrammarMatcher(compiler.compile_grammar(ebnf))
        return m.accept_string(text) and m.is_completed()  # the end of the grammar: only a stop token may follow

    return accepts


def test_the_constraint_admits_calls_that_validate(accepts):
    from minisgl.grammar.tools import tool_grammar

    required = tool_grammar(TOOLS, "required", False, "hermes")
    assert accepts(required, CALL)
    assert not accepts(required, CALL.replace("celsius", "kelvin"))  # not in the enum
    assert not accepts(required, CALL.replace("get_weather", "get_time"))  # not a function offered
    assert not accepts(required, "Sure. " + CALL)  # required: the answer is the call
    assert not accepts(required, CALL + "\n" + CALL)  # parallel_tool_calls false: one call
    assert accepts(tool_grammar(TOOLS, "required", True, "hermes"), CALL + "\n" + CALL)
    auto = tool_grammar(TOOLS, "auto", True, "hermes")
    assert accepts(auto, "Let me look. " + CALL) and accepts(auto, "No call.")
    assert not accepts(auto, "Let me look. " + CALL.replace("Paris", "x" * 30))  # maxLength 20
    assert accepts(tool_grammar(TOOLS, "required", True, "llama3"), '{"name": "get_weather", "parameters": '
                   '{"city": "Oslo", "unit": "fahrenheit"}}')  # fmt: skip
    assert tool_grammar(TOOLS, "none", True, "hermes") is None


class Place(pydantic.BaseModel):
    city: str
    country: str


class Trip(pydantic.BaseModel):
    start: Place
    stops: list[Place]


class Tree(pydantic.BaseModel):
    value: int
    kids: list[Tree]


def test_nested_and_recursive_models_keep_their_refs(accepts):
    """pydantic writes a nested model as ``$defs`` and ``$ref``s into the parameters' own root: they
    must still resolve once the parameters sit inside the call's schema."""
    from minisgl.grammar.tools import tool_grammar

    tools = [openai.pydantic_function_tool(Trip), openai.pydantic_function_tool(Tree)]
    ebnf = tool_grammar(tools, "required", False, "hermes")
    trip = {"start": {"city": "Oslo", "country": "NO"}, "stops": [{"city": "Rome", "country": "IT"}]}
    block = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
    assert accepts(ebnf, block.format("Trip", json.dumps(trip)))
    assert accepts(ebnf, block.format("Tree", json.dumps({"value": 1, "kids": [{"value": 2, "kids": []}]})))
    assert not accepts(ebnf, block.format("Trip", json.dumps({"start": {"city": "Oslo"}, "stops": []})))
    assert not accepts(ebnf, block.format("Tree", json.dumps(trip)))


# ---- a server on the embedded model, through the real clients ---------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(["--reasoning-parser", "qwen3"], tmp_path_factory.mktemp("server-tools"))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=180)


class GetWeather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    unit: str


def test_openai_parse_with_a_pydantic_tool(client):
    tools = [openai.pydantic_function_tool(GetWeather)]
    kw = dict(tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60)
    r = client.chat.completions.parse(model=MODEL, messages=ASK, tools=tools, **kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather)
    assert call.id.startswith("call_") and call.type == "function"


def gather_stream(chunks) -> tuple[list[dict], str, str | None]:
    calls: dict[int, dict] = {}
    content, reason = "", None
    for ch in chunks:
        d = ch.choices[0].delta
        content += d.content or ""
        for c in d.tool_calls or ():
            slot = calls.setdefault(c.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or c.id
            slot["name"] += (c.function.name or "") if c.function else ""
            slot["arguments"] += (c.function.arguments or "") if c.function else ""
        reason = ch.choices[0].finish_reason or reason
    return [calls[i] for i in sorted(calls)], content, reason


def test_streamed_and_whole_tool_calls_agree(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=80)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls
    for c in whole.message.tool_calls:
        assert c.function.name == "get_weather"
        jsonschema.validate(json.loads(c.function.arguments), WEATHER)
    calls, content, reason = gather_stream(client.chat.completions.create(**kw, stream=True))
    assert reason == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls)


def test_tool_choice_none_answers_with_text(client):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=12
    )
    plain = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=12)
    m = r.choices[0].message
    assert m.tool_calls is None and m.content and r.choices[0].finish_reason in ("stop", "length")
    assert m.content == plain.choices[0].message.content  # the tools are not shown: the same prompt


def test_a_chat_without_tools_keeps_its_greedy_tokens(server, client):
    from minisgl.models.embedded import embedded_model_path
    from minisgl.tokenizer import apply_chat_template, load_tokenizer

    ids = apply_chat_template(load_tokenizer(embedded_model_path()), ASK)
    chat = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=16, logprobs=True)
    done = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=16)
    assert chat.choices[0].message.content == done.choices[0].text


def test_langchain_agent_loop_reaches_an_answer(server):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    ran = []

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        ran.append(city)
        return f"It is 18 C and sunny in {city}."

    llm = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=40)
    first, free = llm.bind_tools([get_weather], tool_choice="get_weather"), llm.bind_tools([get_weather])
    msgs = [HumanMessage("What is the weather in Paris?")]
    for step in range(4):
        ai = (first if step == 0 else free).invoke(msgs)
        msgs.append(ai)
        if not ai.tool_calls:
            break
        msgs += [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in ai.tool_calls]
    assert ran, "the forced first turn called the tool"
    assert not msgs[-1].tool_calls and isinstance(msgs[-1].content, str) and msgs[-1].content.strip(), msgs


def test_reasoning_is_split_streamed_and_not(server, client):
    body = {"model": MODEL, "messages": ASK, "temperature": 0, "max_tokens": 30,
            "ebnf": 'root ::= "<think>" "weigh it" "</think>" "\\n\\nAnswer."'}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=180).json()
    assert r["choices"][0]["message"]["reasoning_content"] == "weigh it"
    assert r["choices"][0]["message"]["content"] == "Answer."
    got = {"reasoning_content": "", "content": ""}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=180) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                for key in got:
                    got[key] += delta.get(key) or ""
    assert got == {"reasoning_content": "weigh it", "content": "Answer."}


@pytest.mark.parametrize(
    "change, param",
    [
        ({"tools": [{"type": "retrieval", "function": TOOLS[0]["function"]}]}, "tools.0.type"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}
                ]
            },
            "tools",
        ),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tools": TOOLS + TOOLS}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, None),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_bad_tools_get_a_400_naming_the_field(server, change, param):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 4, **change}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param, err
    assert (param or "tools").split(".")[0] in err["message"]
