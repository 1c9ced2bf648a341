"""Thinking-channel separation: the splitter alone, then real models in every marker format."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi import validate

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.text.reasoning import ReasoningSplitter, detect
from gateway.wire.openai import parse_chat

HI = [{"role": "user", "content": "hi"}]
S = tm.Special

SAMPLES = {
    "think": ["<think>\nLet me think.\n</think>\n\nThe answer is 4.", "no thinking at all", "<think>only thinking",
              "a</think>b<think>c</think>d", "<think></think>x", "<thin", "x <think", "</thi"],
    "channel": ["<|channel>thought\nhmm, 2+2<channel|>It is 4.", "<|channel>thought\nA<|channel>final\nB",
                "plain", "<|channel>analysis\nx<channel|>y<|channel>thinking\nz<channel|>w", "<|chan"],
    "harmony": ["<|channel|>analysis<|message|>think hard<|end|><|start|>assistant<|channel|>final<|message|>4",
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>", "just text",
                "<|start|>assistant<|message|>hello<|return|>", "<|channel|>analysis<|mess"],
}


def split(fmt, pieces, tail=""):
    s = ReasoningSplitter(fmt, tail)
    out = []
    for p in pieces:
        out += s.feed(p)
    out += s.flush()
    return "".join(t for k, t in out if k == "thinking"), "".join(t for k, t in out if k == "content")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(f, t) for f, texts in SAMPLES.items() for t in texts]),
       st.lists(st.integers(0, 200), max_size=12))
def test_any_cuts_give_the_same_split(sample, points):
    fmt, text = sample
    cuts = sorted({p % (len(text) + 1) for p in points})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert split(fmt, pieces) == split(fmt, [text])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(SAMPLES)), st.lists(st.sampled_from(
    ["<think>", "</think>", "<|channel>", "<channel|>", "thought\n", "final\n", "<|channel|>", "<|message|>",
     "<|end|>", "<|start|>", "analysis", "final", "a", " b", "\n", "<", "|", ">"]), max_size=12),
    st.lists(st.integers(0, 200), max_size=12))
def test_generated_texts_in_random_cuts_never_leak_markers(fmt, words, points):
    text = "".join(words)
    cuts = sorted({p % (len(text) + 1) for p in points})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    thinking, content = split(fmt, pieces)
    assert (thinking, content) == split(fmt, [text])
    markers = {"think": ["<think>", "</think>"], "channel": ["<|channel>", "<channel|>"],
               "harmony": ["<|channel|>", "<|message|>", "<|end|>", "<|start|>"]}[fmt]
    if fmt == "think":  # as llama.cpp reads them: an opener written while thinking is open is
        # thinking text, and a closer written once the answer's text began is the answer's
        at = content.find("</think>")
        assert at < 0 or content[:at].strip()
        thinking, content = thinking.replace("<think>", ""), content.replace("</think>", "")
    assert not any(m in thinking or m in content for m in markers)


@pytest.mark.parametrize("fmt, text, thinking, content", [
    ("think", "<think>\nLet me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4."),
    ("think", "<think>\n\n</think>\n\nJust the answer.", "", "Just the answer."),
    ("channel", "<|channel>thought\nhmm, 2+2<channel|>It is 4.", "hmm, 2+2", "It is 4."),
    ("channel", "<|channel>thought\nA<|channel>final\nB", "A", "B"),
    ("harmony", SAMPLES["harmony"][0], "think hard", "4"),
    ("harmony", "just text", "", "just text"),
])
def test_formats(fmt, text, thinking, content):
    assert split(fmt, list(text)) == (thinking, content)


def test_a_template_that_opens_think_in_the_prompt_starts_inside_it():
    assert split("think", ["Reasoning here.</think>Answer."], tail="<|im_start|>assistant\n<think>\n") == \
        ("Reasoning here.", "Answer.")
    assert split("think", ["Answer."], tail="assistant\n<think>\n\n</think>\n\n") == ("", "Answer.")
    assert split("harmony", ["<|channel|>final<|message|>Hi"], tail="<|start|>assistant") == ("", "Hi")


@pytest.mark.parametrize("text, thinking, content", [
    ("<think>\n<think>x</think>a</think>b", "<think>x", "a</think>b"),  # the opener again is thinking text
    ("</think>\n\nHi</think>", "", "Hi</think>"),  # a closer before the answer's text is dropped, after it kept
])
def test_a_thinking_block_as_llama_cpp_reads_it(text, thinking, content):
    for pieces in ([text], list(text)):
        assert split("think", pieces) == (thinking, content)


def test_thinking_not_split_keeps_the_opener_the_prompt_wrote():
    """A chat's answer continues the thinking its prompt opened: with thinking not split out, its
    text begins with the prompt's opener, as llama.cpp's parsers give it; a completion's does not
    (it continues its own prompt)."""
    from gateway.text.reasoning import unsplit

    cases = [("think", "<|im_start|>assistant\n<think>\n", "Hm.\n</think>\n\nHi.", "<think>\nHm.\n</think>\n\nHi."),
             ("think", "<|im_start|>assistant\n", "Hi.", "Hi."),
             ("cohere", "<|CHATBOT_TOKEN|><|START_THINKING|>", "Hm.<|END_THINKING|><|START_TEXT|>Hi<|END_TEXT|>",
              "<|START_THINKING|>Hm.<|END_THINKING|>Hi"),
             ("cohere", "<|CHATBOT_TOKEN|>", "<|START_RESPONSE|>Hi<|END_RESPONSE|>", "Hi")]
    for fmt, tail, text, content in cases:
        for pieces in ([text], list(text)):
            assert split(unsplit(fmt), pieces, tail=tail) == ("", content)
    assert unsplit("think", chat=False) is None and unsplit("harmony") == "harmony_inline"


def test_apriels_prompt_writes_the_first_words_of_its_thinking():
    """They are the thinking's (as llama.cpp reads them, and as the template writes a turn's
    reasoning back), whether the prompt wrote them or the answer did."""
    from realmodel import CACHE

    source = tm.llama_cpp_source_file("models/templates/Apriel-1.6-15b-Thinker-fixed.jinja", CACHE / "templates")
    fmt = detect(source.read_text(), [])
    tail = "<|begin_user|>\nhi\n<|begin_assistant|>\nHere are my reasoning steps:\n"
    want = ("Here are my reasoning steps:\nLet me see.", "Sure.")
    assert split(fmt, list("Let me see.\n[BEGIN FINAL RESPONSE]\nSure."), tail=tail) == want
    assert split(fmt, ["Here are my reasoning steps:\nLet me see.\n[BEGIN FINAL RESPONSE]\nSure."]) == want


@pytest.mark.parametrize("tail, text, before", [
    ("<|start|>assistant", "<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.f<|channel|>commentary "
                           "json<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=assistant<|message|>b",
     ("a", "{}b")),
    ("<|start|>assistant", "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=functions.f "
                           "<|constrain|>json<|message|>{}<|call|><|start|>assistant<|channel|>final<|message|>b",
     ("a", "{}b")),
    ("", "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis to=functions.f<|message|>{}"
         "<|call|><|start|>assistant<|channel|>final<|message|>b", ("a{}", "b")),
])
def test_harmony_calls_name_their_recipient(tail, text, before):
    want = [("thinking", "a"), ("recipient", "functions.f"), ("call", "{}"), ("content", "b")]
    for pieces in ([text], list(text)):
        s = ReasoningSplitter("harmony", tail, calls=True)
        out = [seg for p in pieces for seg in s.feed(p)] + s.flush()
        merged = []
        for kind, t in out:
            if merged and merged[-1][0] == kind and kind != "recipient":
                merged[-1] = (kind, merged[-1][1] + t)
            else:
                merged.append((kind, t))
        assert merged == want
    assert split("harmony", [text], tail) == before  # without calls=True: the body goes by its channel, as before


def test_detect_from_template_and_vocabulary():
    assert detect(None, ["<|channel|>", "<|message|>"]) == "harmony"
    assert detect("... <|channel>thought ...", []) == "channel"
    assert detect("{% if enable_thinking %}<think>{% endif %}", []) == "think"
    assert detect(None, ["<think>", "</think>"]) == "think"
    assert detect("{{ messages }}", []) is None


def test_earlier_reasoning_is_handed_over_apart_from_the_content():
    parsed = parse_chat({"model": "m", "messages": [
        {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
        {"role": "assistant", "content": "5", "reasoning": "2+3"}]})
    first, second = parsed.request.messages
    assert first["content"] == "4" and first["reasoning_content"] == first["thinking"] == "2+2"
    assert second["content"] == "5" and second["reasoning_content"] == "2+3"


# --- real models ----------------------------------------------------------------------------

HARMONY_EXTRA = ["<|return|>", "<|call|>"]  # as in gpt-oss: with these, llama.cpp does not end at <|end|>
THINK_OPENING = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
                 "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
                 "{% else %}<think>\n{% endif %}")
REASONING_ECHO = ("{% for m in messages %}{{ m['content'] }}{% if m['reasoning_content'] %}[R:"
                  "{{ m['reasoning_content'] }}]{% endif %}|{% endfor %}\n")

CASES = {
    # name: (steps, thinking, content, models.yaml extras)
    "think": ([S("<think>"), "\n", "Let", " me", " think", ".", "\n", S("</think>"), "\n\n", "It", " is", " 4."],
              "Let me think.", "It is 4.", {}),
    "think-split": (["<th", "ink", ">", "Let", " me", " think", ".", "</", "think", ">", "It", " is", " 4."],
                    "Let me think.", "It is 4.", {"reasoning": "think"}),
    "channel": ([S("<|channel>"), "thought", "\n", "Two", " plus", " two", S("<channel|>"), "It", " is", " 4."],
                "Two plus two", "It is 4.", {}),
    "channel-split": (["<|chan", "nel>", "thought", "\n", "Two", " plus", " two", "<chan", "nel|>", "It", " is",
                       " 4."], "Two plus two", "It is 4.", {"reasoning": "channel"}),
    # The scripted model plays each token once, so each harmony model has one of the two headers
    # as single special tokens and the other spelled in ordinary tokens.
    "harmony": ([S("<|channel|>"), "analysis", S("<|message|>"), "Two", " plus", " two", S("<|end|>"),
                 S("<|start|>"), "assistant", "<|chan", "nel|>", "final", "<|mes", "sage|>", "It", " is", " 4."],
                "Two plus two", "It is 4.", {}),
    "harmony-final": (["<|chan", "nel|>", "analysis", "<|mes", "sage|>", "Two", " plus", " two", S("<|end|>"),
                       S("<|start|>"), "assistant", S("<|channel|>"), "final", S("<|message|>"), "It", " is",
                       " 4."], "Two plus two", "It is 4.", {}),
    "harmony-split": (["<|chan", "nel|>", "analysis", "<|mes", "sage|>", "Two", " plus", " two", "<|e", "nd|>",
                       "<|st", "art|>", "assistant", "<|ch", "annel|>", "final", "<|me", "ssage|>", "It", " is",
                       " 4."], "Two plus two", "It is 4.", {"reasoning": "harmony"}),
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("reasoning")
    for name, (steps, *_rest) in CASES.items():
        tm.write_scripted_model(d / f"{name}.gguf", tm.Script(steps),
                                extra_special=HARMONY_EXTRA if name.startswith("harmony") else ())
    tm.plain(d / "opens.gguf", ["Reasoning", " here", ".", S("</think>"), "Answer", "."])
    tm.plain(d / "plain.gguf", ["Answer", "."])
    return d


@pytest.fixture
async def client(aiohttp_client, model_files, write_config):
    lines = ["models:"]
    for name, (*_, extra) in CASES.items():
        lines += [f"  {name}:", f"    path: {model_files}/{name}.gguf"] + [f"    {k}: {v}" for k, v in extra.items()]
    lines += [f"  opens:\n    path: {model_files}/opens.gguf\n    chat_template: {json.dumps(THINK_OPENING)}",
              f"  toggle:\n    path: {model_files}/plain.gguf\n    chat_template: {json.dumps(THINK_OPENING)}",
              f"  echo:\n    path: {model_files}/plain.gguf\n    chat_template: {json.dumps(REASONING_ECHO)}"]
    return await aiohttp_client(create_app(load_config(write_config("\n".join(lines) + "\n"))))


async def whole(client, model, **extra):
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": HI, **extra})
    body = await r.json()
    assert r.status == 200, body
    validate(body, "CreateChatCompletionResponse")
    return body


async def streamed(client, model, **extra):
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": HI, "stream": True,
                                                        "stream_options": {"include_usage": True}, **extra})
    assert r.status == 200
    chunks = []
    async for line in r.content:
        line = line.decode().strip()
        if line.startswith("data: {"):
            chunks.append(json.loads(line[6:]))
    for c in chunks:
        validate(c, "CreateChatCompletionStreamResponse")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    thinking = "".join(d.get("reasoning_content", "") for d in deltas)
    assert thinking == "".join(d.get("reasoning", "") for d in deltas)
    return thinking, "".join(d.get("content") or "" for d in deltas), chunks[-1]["usage"]


@pytest.mark.parametrize("name", list(CASES))
async def test_every_format_streamed_and_whole(client, name):
    _, thinking, content, _ = CASES[name]
    body = await whole(client, name)
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["reasoning"], message["content"]) == (thinking, thinking, content)
    s_thinking, s_content, usage = await streamed(client, name)
    assert (s_thinking, s_content) == (thinking, content)
    assert usage["completion_tokens_details"]["reasoning_tokens"] == \
        body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_reasoning_tokens_are_counted_exactly(client):
    body = await whole(client, "think")
    # <think>, "\n", Let, " me", " think", ".", "\n" are thinking; </think> and the answer are not
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 7
    assert body["usage"]["completion_tokens"] == 12


async def test_reasoning_format_none_returns_the_raw_text(client):
    body = await whole(client, "think", reasoning_format="none")
    message = body["choices"][0]["message"]
    assert message["content"] == "<think>\nLet me think.\n</think>\n\nIt is 4." and "reasoning_content" not in message
    thinking, content, _ = await streamed(client, "harmony", reasoning_format="none")
    # gpt-oss as llama.cpp reads it with thinking not split: the analysis message as written, the
    # other messages' headers dropped
    assert thinking == "" and content == "<|channel|>analysis<|message|>Two plus two<|end|>It is 4."
    r = await client.post("/v1/chat/completions", json={"model": "think", "messages": HI, "reasoning_format": 3})
    assert r.status == 400 and (await r.json())["error"]["param"] == "reasoning_format"


async def test_an_answer_opening_with_think_as_text_is_split_on_a_model_that_showed_no_marker(
        aiohttp_client, model_files, write_config):
    cfg = load_config(write_config(f"""
        models:
          m: {model_files}/think-split.gguf
          raw:
            path: {model_files}/think-split.gguf
            reasoning: none
    """))
    client = await aiohttp_client(create_app(cfg))
    # ChatML template, no <think> token in the vocabulary: auto finds no marker, but the answer
    # opens with <think> written as text, as some fine-tunes do
    message = (await whole(client, "m"))["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Let me think.", "It is 4.")
    raw = (await whole(client, "raw"))["choices"][0]["message"]
    assert raw["content"] == "<think>Let me think.</think>It is 4." and "reasoning_content" not in raw


def test_think_only_at_the_start_on_such_a_model():
    from gateway.text.reasoning import ReasoningSplitter

    later = ReasoningSplitter("think_leading", "<|im_start|>assistant\n")
    assert later.feed(" Use <think> tags.") + later.flush() == [("content", " Use <think> tags.")]
    cut = ReasoningSplitter("think_leading")
    out = [seg for piece in ["\n <th", "ink", ">a", "</thi", "nk>b"] for seg in cut.feed(piece)] + cut.flush()
    assert out == [("thinking", "a"), ("content", "b")]


@pytest.mark.parametrize("fmt, text", [
    ("think_mistral", "[THINK]Plan.[/THINK]Done."),
    ("seed", "<seed:think>Plan.</seed:think>Done."),
    ("pair:" + json.dumps(["<reasoning>", "</reasoning>"]), "<reasoning>Plan.</reasoning>Done."),
])
def test_more_thinking_formats_cut_anywhere(fmt, text):
    from gateway.text.reasoning import ReasoningSplitter

    for cut in range(1, len(text)):
        r = ReasoningSplitter(fmt)
        out = r.feed(text[:cut]) + r.feed(text[cut:]) + r.flush()
        merged: list[tuple[str, str]] = []
        for kind, piece in out:
            if merged and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + piece)
            else:
                merged.append((kind, piece))
        assert merged == [("thinking", "Plan."), ("content", "Done.")], (cut, out)


@pytest.mark.parametrize("name, fmt", [("mistralai-Ministral-3-14B-Reasoning-2512", "think_mistral"),
                                       ("ByteDance-Seed-OSS", "seed")])
def test_new_formats_are_detected_from_real_templates(name, fmt):
    from realmodel import CACHE

    from gateway.models import testmodels as tm
    from gateway.text.reasoning import detect

    source = tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()
    assert detect(source, []) == fmt


async def test_a_template_that_opens_think_and_enable_thinking(client):
    message = (await whole(client, "opens"))["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Reasoning here.", "Answer.")
    message = (await whole(client, "toggle"))["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == ("Answer.", "")  # thinking-only
    message = (await whole(client, "toggle", chat_template_kwargs={"enable_thinking": False}))["choices"][0]["message"]
    assert ("reasoning_content" not in message, message["content"]) == (True, "Answer.")


async def test_earlier_reasoning_reaches_the_template_as_such(client):
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A", "reasoning_content": "xyz"},
             {"role": "user", "content": "again"}]
    with_r = await whole(client, "echo", messages=turns)
    without = await whole(client, "echo", messages=[turns[0], {"role": "assistant", "content": "A"}, turns[2]])
    # the template renders "[R:xyz]" from reasoning_content: 7 more prompt tokens, and the content untouched
    assert with_r["usage"]["prompt_tokens"] - without["usage"]["prompt_tokens"] == len("[R:xyz]")


async def test_reasoning_fields_can_be_picked(aiohttp_client, model_files, write_config):
    cfg = load_config(write_config(f"server:\n  reasoning_fields: [reasoning]\nmodels:\n  t: {model_files}/think.gguf\n"))
    client = await aiohttp_client(create_app(cfg))
    message = (await whole(client, "t"))["choices"][0]["message"]
    assert message["reasoning"] == "Let me think." and "reasoning_content" not in message


def test_a_model_names_its_own_pair_of_markers(write_config):
    from gateway.models.config import ConfigError
    from gateway.text.reasoning import pair_format

    cfg = load_config(write_config('models:\n  m:\n    path: x.gguf\n    reasoning: ["<r>", "</r>"]\n'))
    assert cfg.models[0].reasoning == pair_format("<r>", "</r>")
    for bad in ('["<r>"]', '["<r>", "<r>"]', '["", "</r>"]', "sometimes"):
        with pytest.raises(ConfigError, match="models.m.reasoning"):
            load_config(write_config(f"models:\n  m:\n    path: x.gguf\n    reasoning: {bad}\n"))
