"""The router's token ids for chat requests equal the engine's, for real published chat templates.

The oracle is transformers 5.19 (what SGLang 0.5.23 pins): `apply_chat_template(messages,
tools=..., add_generation_prompt=True, tokenize=False, **kwargs)`, then `encode(text,
add_special_tokens=False)`, which is how SGLang's `serving_chat.py` renders and encodes a chat
request. The router's ids come from `loadlink wire prompt-ids --tokenizer DIR`, the same code the
router prices requests with. The templates are the models' own (see templates/SOURCES.md); the
tokenizer is a small byte-level BPE built here, with each model's special tokens, saved by
transformers (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`): the template text
is what differs between the two renderers, the tokenization half only has to be the same file.

The messages and tools handed to the oracle are the request's as SGLang hands them to the
template (`as_sglang_passes`: dumped by SGLang's own pydantic request models, then the steps of
`serving_chat.py`, each named): the Rust side derives the same from the raw request body.
"""

from __future__ import annotations

import json
import pathlib

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from conftest import run_json  # noqa: E402
from test_routed_rank import sglang  # noqa: E402

TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"

# The special tokens each model's tokenizer names (bos, eos) and the other control tokens its
# template prints, so that both sides split them out as single ids.
MODELS = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>", ["<|im_start|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]),
    "Qwen-Qwen3-0.6B": (None, "<|im_end|>", ["<|im_start|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"]),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>", ["[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]),
    "google-gemma-2-2b-it": ("<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"]),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — in °C, with a 0.5 precision",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1.0},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}

SYSTEM = {"role": "system", "content": "You are a terse assistant.\nAnswer in one line."}
TURNS = [
    {"role": "user", "content": "  What is the capital of France?  "},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? Answer with a \"quote\" and an emoji 🙂"},
]
CALL = [
    {"role": "user", "content": "Weather in Zürich for 2 days?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 2}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"},
]

REQUESTS = {
    "one turn": {"messages": [{"role": "user", "content": "Hello there"}]},
    "system and multi-turn": {"messages": [SYSTEM, *TURNS]},
    "text parts": {"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second part"}]}]},
    "last turn from the assistant": {"messages": [SYSTEM, *TURNS[:2]]},
    "tools": {"messages": [SYSTEM, TURNS[0]], "tools": [WEATHER, SEARCH]},
    "tools without a system prompt": {"messages": [TURNS[0]], "tools": [WEATHER]},
    "a tool call and its result": {"messages": [SYSTEM, *CALL], "tools": [WEATHER]},
    "tool_choice none": {"messages": [SYSTEM, TURNS[0]], "tools": [WEATHER], "tool_choice": "none"},
    "chat_template_kwargs": {"messages": [TURNS[0]], "chat_template_kwargs": {"enable_thinking": False}},
}


def as_sglang_passes(body: dict) -> tuple[list[dict], list[dict] | None, dict]:
    """The messages, tools and keyword arguments SGLang 0.5.23 hands `apply_chat_template` for
    `body`, for a template that reads content as a string (none of these loops over parts).

    The request is parsed and dumped by SGLang's own pydantic models (`ChatCompletionRequest`,
    loaded from the wheel as test_routed_rank.py loads it); the steps `serving_chat.py` then takes
    (`_apply_jinja_template`) are written out below, each named after SGLang's function."""
    req = sglang().protocol.ChatCompletionRequest(model="m", **body)
    messages = []
    for m in (msg.model_dump() for msg in req.messages):
        # normalize_assistant_tool_call_arguments: JSON-string arguments decoded.
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if m.get("content") is None:
            m["content"] = ""
        # process_content_for_template_format(..., "string"): text parts joined by a space; then
        # top-level nulls dropped.
        if isinstance(m["content"], list):
            m["content"] = " ".join(p["text"] for p in m["content"] if p.get("type") == "text")
        messages.append({k: v for k, v in m.items() if v is not None})
    # _handle_last_assistant_message: a final assistant turn is rendered as the user's.
    if messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str):
        messages[-1] = {"role": "user", "content": messages[-1]["content"]}
    tools = None
    if req.tools and req.tool_choice != "none":
        tools = [t.model_dump() for t in req.tools]
    return messages, tools, dict(body.get("chat_template_kwargs") or {})


def corpus() -> list[str]:
    texts = [json.dumps(REQUESTS, ensure_ascii=False), json.dumps([WEATHER, SEARCH], indent=4, ensure_ascii=False)]
    texts += [p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.jinja"))]
    return texts * 3


def build_tokenizer(model: str, dest: pathlib.Path) -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bos, eos, controls = MODELS[model]
    specials = [t for t in (bos, eos) if t] + controls
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos)
    fast.chat_template = (TEMPLATES / f"{model}.jinja").read_text(encoding="utf-8")
    fast.save_pretrained(dest)
    return transformers.AutoTokenizer.from_pretrained(dest)


def oracle_ids(tok, body: dict) -> list[int] | None:
    messages, tools, kwargs = as_sglang_passes(body)
    try:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
    except Exception:
        if not tools:
            return None
        # serving_chat.py retries with bare functions for templates that want them.
        try:
            text = tok.apply_chat_template(
                messages, tools=[t["function"] for t in tools], add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception:
            return None
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_router_ids_equal_apply_chat_template(model, tmp_path):
    tok = build_tokenizer(model, tmp_path)
    assert (tmp_path / "tokenizer.json").exists()
    names = list(REQUESTS)
    bodies = [REQUESTS[n] for n in names]
    got = [json.loads(line) for line in run_json(["wire", "prompt-ids", "--tokenizer", str(tmp_path)], bodies)]
    rendered = 0
    for name, body, mine in zip(names, bodies, got, strict=True):
        want = oracle_ids(tok, body)
        if want is None:
            # The template refuses this request (the engine answers 400): no ids to price.
            assert "error" in mine, f"{model}, {name}: the template refuses it, the router gave {mine}"
            continue
        assert "ids" in mine, f"{model}, {name}: the router failed: {mine}"
        if mine["ids"] != want:
            diverged = next((i for i, (a, b) in enumerate(zip(mine["ids"], want)) if a != b), min(len(mine["ids"]), len(want)))
            pytest.fail(
                f"{model}, {name}: ids differ from token {diverged}:\n"
                f"router: {tok.decode(mine['ids'][diverged:diverged + 40])!r}\n"
                f"oracle: {tok.decode(want[diverged:diverged + 40])!r}"
            )
        rendered += 1
    # Gemma refuses system prompts, Llama 3.1 tools without a user turn: the rest must render.
    assert rendered >= 3, f"{model}: only {rendered} of {len(names)} requests rendered"
