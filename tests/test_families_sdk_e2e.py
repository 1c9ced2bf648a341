"""Tool calls of the families issue 37 added, end to end: the real `gguf-gateway serve` process, a
scripted model under the family's real chat template, and the official openai (chat
completions) and anthropic (messages) clients, whole and streamed (read with each SDK's own
stream accumulator), then the tool's result sent back.

Gemma 4's model has llama.cpp's real Gemma 4 vocabulary (`helpers.vocab_scripted_model`); the
other families' vocabularies are not among llama.cpp's, so theirs is the scripted one, with
their markers as control tokens (see FAMILIES). The gateway settles each model's call and
thinking formats from its template at load, as for a user's model (no tool_format in
models.yaml). The model writes the family's call (after its thinking, where the family thinks);
the client must get the call whole, its thinking apart from the content. The history with the
call and the result then renders through the real template, and the second turn answers: a
scripted model's next token depends only on the prompt's last token, so where the template ends
the second prompt as it ended the first, one line is added at its end (after a tool result the
prompt ends in "!", as `helpers.agent_model` does for Qwen 2.5)."""

import json
from dataclasses import dataclass

import anthropic
import openai
import pytest
from helpers import REPO, WEATHER, ServerProcess, run_cli, vocab_scripted_model

from gateway.models import testmodels as tm
from gateway.text import chat_template
from gateway.text.toolformats.deepseek_dsml import DSML
from gateway.worker.toolhistory import for_template

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Weather in Paris?"}]
PARIS = {"city": "Paris"}
FINAL = "It is 18 C in Paris."
CONTEXT = 16384
RESULT_MARK = "{%- if messages[-1]['role'] == 'tool' %}!{% endif %}"
ANTH_WEATHER = {"name": "get_weather", "description": "Weather in a city",
                "input_schema": WEATHER["function"]["parameters"]}


S = tm.Special


@dataclass(frozen=True)
class Family:
    template: str  # llama.cpp's models/templates/NAME.jinja
    vocab: str | None  # llama.cpp's models/ggml-vocab-NAME.gguf; None: the scripted vocabulary, markers as control tokens
    tool_format: str  # what the gateway must settle from the template
    call: list[tm.Step]  # the answer of the first turn: thinking (if any), then the call
    thinking: str  # the thinking the client must get apart ("" for none)
    final: list[tm.Step]  # the answer of the second turn; its content must read FINAL
    mark: bool  # the second prompt ends as the first: add RESULT_MARK


FINAL_STEPS: list[tm.Step] = ["It", " is", " 18", " C", " in", " Paris", "."]
FAMILIES = {
    # Gemma 4's real vocabulary: its markers are that vocabulary's own control tokens. After a
    # result the template leaves the model's turn open (no new generation prompt), so the second
    # prompt ends otherwise.
    "gemma4": Family("google-gemma-4-31B-it", "gemma-4", "gemma4",
                     ['<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>'], "",
                     [FINAL], mark=False),
    # The others' vocabularies are not among llama.cpp's, and a real one (Qwen 2's) cannot
    # script them: a token has one successor, and their syntax repeats tokens such as ">" that
    # a byte-level vocabulary spells one way only. So they get the scripted vocabulary, with
    # their markers as control tokens (as in the families' own vocabularies).
    # GLM 4.7 Flash's template opens <think> in the prompt.
    "glm": Family("GLM-4.7-Flash", None, "glm",
                  ["Paris", " weather", " needed.", S("</think>"), S("<tool_call>"), "get_weather", S("<arg_key>"),
                   "city", S("</arg_key>"), S("<arg_value>"), "Paris", S("</arg_value>"), S("</tool_call>")],
                  "Paris weather needed.", ["Got", " it.", "</think>", *FINAL_STEPS], mark=True),
    "minimax": Family("MiniMax-M2", None, "minimax",
                      ["Need", " the", " weather.", "\n", S("</think>"), "\n\n", S("<minimax:tool_call>"), "\n",
                       '<invoke name="get_weather">', "\n", '<parameter name="city">', "Paris", "</parameter>",
                       "\n", "</invoke>", "\n", S("</minimax:tool_call>")],
                      "Need the weather.", ["Got", " it.", "\n", "</think>", "\n\n", *FINAL_STEPS], mark=True),
    "deepseek_dsml": Family("deepseek-ai-DeepSeek-V3.2", None, "deepseek_dsml",
                            ["<", S(DSML), "function_calls>", "\n", f"<{DSML}invoke", ' name="get_weather">', "\n",
                             f"<{DSML}parameter", ' name="city"', ' string="true">', "Paris", f"</{DSML}parameter>",
                             "\n", f"</{DSML}invoke>", "\n", f"</{DSML}function_calls>"], "",
                            FINAL_STEPS, mark=True),
    "kimi": Family("moonshotai-Kimi-K2", None, "kimi",
                   [S("<|tool_calls_section_begin|>"), S("<|tool_call_begin|>"), "functions.get_weather:0",
                    S("<|tool_call_argument_begin|>"), '{"city":', ' "Paris"}', S("<|tool_call_end|>"),
                    S("<|tool_calls_section_end|>")], "", FINAL_STEPS, mark=True),
    "kimi_thinking": Family("Kimi-K2-Thinking", None, "kimi",
                            [S("<think>"), "Need", " the", " weather.", S("</think>"), S("<|tool_calls_section_begin|>"),
                             S("<|tool_call_begin|>"), "functions.get_weather:0", S("<|tool_call_argument_begin|>"),
                             '{"city":', ' "Paris"}', S("<|tool_call_end|>"), S("<|tool_calls_section_end|>")],
                            "Need the weather.", FINAL_STEPS, mark=True),
    "lfm2": Family("LFM2-8B-A1B", None, "lfm2",
                   [S("<|tool_call_start|>"), "[get_weather(", "city=", '"Paris"', ")]", S("<|tool_call_end|>")], "",
                   FINAL_STEPS, mark=True),
    "seed_oss": Family("ByteDance-Seed-OSS", None, "seed_oss",
                       [S("<seed:think>"), "Need", " the", " weather.", S("</seed:think>"), "\n", S("<seed:tool_call>"),
                        "\n", "<function=get_weather>", "\n", "<parameter=city>", "Paris", "</parameter>", "\n",
                        "</function>", "\n", S("</seed:tool_call>")], "Need the weather.", FINAL_STEPS, mark=True),
    "command_r": Family("CohereForAI-c4ai-command-r7b-12-2024-tool_use", None, "command_r",
                        [S("<|START_ACTION|>"), "[\n", "    {", '"tool_call_id":', ' "0",', ' "tool_name":',
                         ' "get_weather",', ' "parameters":', ' {"city":', ' "Paris"}}', "\n]", S("<|END_ACTION|>")],
                        "", [S("<|START_RESPONSE|>"), *FINAL_STEPS, S("<|END_RESPONSE|>")], mark=True),
    "command_r_plus": Family("CohereForAI-c4ai-command-r-plus-tool_use", None, "command_r_plus",
                             ["Action:", "\n", "```json", "\n", "[", "\n    {", '\n        "tool_name":', ' "get_weather",',
                              '\n        "parameters":', ' {"city":', ' "Paris"}', "\n    }", "\n]", "```"],
                             "", FINAL_STEPS, mark=True),
    "firefunction_v2": Family("fireworks-ai-llama-3-firefunction-v2", None, "firefunction_v2",
                              [" functools", "[{", '"name":', ' "get_weather",', ' "arguments":', ' {"city":',
                               ' "Paris"}}]'], "", FINAL_STEPS, mark=True),
}


def template(fam: Family) -> str:
    text = tm.llama_cpp_source_file(f"models/templates/{fam.template}.jinja", REPO / ".cache" / "templates").read_text()
    return text + RESULT_MARK if fam.mark else text


def prompt(fam: Family, messages: list[dict]) -> str:
    """The prompt the gateway's worker renders for ``messages`` with the weather tool."""
    [(history, tools), *_] = for_template(messages, [WEATHER], fam.tool_format, template(fam))
    return chat_template.render(template(fam), history, tools=tools)


HISTORY = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": PARIS}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    d = tmp_path_factory.mktemp("families-sdk")
    lines = ["server:", "  discover_default_stores: false", "  max_loaded_models: 2", "models:"]
    for name, fam in FAMILIES.items():
        first, second = prompt(fam, ASK), prompt(fam, HISTORY)
        if fam.vocab:
            vocab_scripted_model(d / f"{name}.gguf", fam.vocab, template(fam), [(first, fam.call), (second, fam.final)])
        else:  # the prompt's last character starts each script
            tm.write_scripted_model(d / f"{name}.gguf", [tm.Script(fam.call, trigger=first[-1]),
                                                         tm.Script(fam.final, trigger=second[-1])],
                                    chat_template=template(fam), context_length=CONTEXT)
        # Command R7B's template writes a long preamble: longer than 4096 byte tokens
        lines += [f"  {name}:", f"    path: {d}/{name}.gguf", f"    n_ctx: {CONTEXT}"]
    (d / "models.yaml").write_text("\n".join(lines) + "\n")
    return d / "models.yaml"


@pytest.fixture(scope="module")
def server(config):
    with ServerProcess("--config", str(config), env={"HOME": str(config.parent)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def anth(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        yield c


def thinking_of(message) -> str:
    return (message.model_extra or {}).get("reasoning_content") or ""


def test_the_gateway_settles_each_familys_format_from_its_template(config):
    # `gguf-gateway models` reads a model's format by the function its load settles it with
    # (formats.tool_format, tool_format auto); the calls below only parse if the load did too
    done = run_cli("models", "--config", str(config), "--json", env={"HOME": str(config.parent)})
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert {name: rows[name]["tool_format"] for name in FAMILIES} == {n: f.tool_format for n, f in FAMILIES.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_openai_whole_streamed_and_the_result_back(oai, name):
    fam = FAMILIES[name]
    first = oai.chat.completions.create(model=name, messages=ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == PARIS
    assert not choice.message.content and thinking_of(choice.message) == fam.thinking

    with oai.chat.completions.stream(model=name, messages=ASK, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_completion().choices[0]
    assert "tool_calls.function.arguments.done" in kinds and streamed.finish_reason == "tool_calls"
    [scall] = streamed.message.tool_calls
    assert scall.function.name == "get_weather" and json.loads(scall.function.arguments) == PARIS
    assert not streamed.message.content and thinking_of(streamed.message) == fam.thinking

    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    second = oai.chat.completions.create(model=name, messages=history, tools=[WEATHER]).choices[0]
    assert second.message.content == FINAL and second.finish_reason == "stop" and not second.message.tool_calls


@pytest.mark.parametrize("name", FAMILIES)
def test_anthropic_whole_streamed_and_the_result_back(anth, name):
    fam = FAMILIES[name]
    first = anth.messages.create(model=name, max_tokens=200, messages=ASK, tools=[ANTH_WEATHER])
    assert first.stop_reason == "tool_use", first
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == PARIS
    assert "".join(b.thinking for b in first.content if b.type == "thinking") == fam.thinking
    assert not "".join(b.text for b in first.content if b.type == "text")

    with anth.messages.stream(model=name, max_tokens=200, messages=ASK, tools=[ANTH_WEATHER]) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds and message.stop_reason == "tool_use"
    [suse] = [b for b in message.content if b.type == "tool_use"]
    assert suse.name == "get_weather" and suse.input == PARIS
    assert "".join(b.thinking for b in message.content if b.type == "thinking") == fam.thinking
    assert not "".join(b.text for b in message.content if b.type == "text")

    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    second = anth.messages.create(model=name, max_tokens=200, messages=history, tools=[ANTH_WEATHER])
    assert second.stop_reason == "end_turn", second
    assert "".join(b.text for b in second.content if b.type == "text") == FINAL
