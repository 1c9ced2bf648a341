import pytest

from gateway.text.chat_template import CHATML, TemplateBroken, TemplateInputError, render

MSGS = [{"role": "user", "content": "hi"}]


def test_chatml_with_generation_prompt():
    assert render(CHATML, MSGS) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(CHATML, MSGS, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_bos_eos_and_extra_variables_reach_the_template():
    tmpl = "{{ bos_token }}{% if enable_thinking %}T{% else %}F{% endif %}{{ messages[0]['content'] | tojson }}"
    assert render(tmpl, MSGS, bos_token="<s>", extra={"enable_thinking": True}) == '<s>T"hi"'
    assert render(tmpl, [{"role": "user", "content": "日本"}]) == 'F"日本"'  # tojson keeps non-ASCII as is


def test_raise_exception_is_the_callers_mistake():
    with pytest.raises(TemplateInputError, match="alternate"):
        render("{{ raise_exception('roles must alternate') }}", MSGS)


@pytest.mark.parametrize("tmpl", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append(1) %}",
    "{{ cycler.__init__.__globals__.os.system('true') }}",
])
def test_hostile_templates_are_stopped_by_the_sandbox(tmpl):
    with pytest.raises(TemplateBroken):
        render(tmpl, MSGS)


def test_a_template_that_does_not_compile():
    with pytest.raises(TemplateBroken, match="does not compile"):
        render("{% for %}", MSGS)


# --- tools and tool history through real templates (llama.cpp's collection) ---------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TWO_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"},
]


@pytest.fixture(scope="module")
def real_template():
    from realmodel import CACHE

    from gateway.models import testmodels as tm

    def read(name: str) -> str:
        return tm.llama_cpp_source_file(f"models/templates/{name}.jinja", CACHE / "templates").read_text()
    return read


@pytest.mark.parametrize("name, as_string", [
    ("Qwen-Qwen2.5-7B-Instruct", False), ("meta-llama-Llama-3.1-8B-Instruct", False),
    ("deepseek-ai-DeepSeek-V3.1", False), ("meetkai-functionary-medium-v3.2", True),
])
def test_a_calls_arguments_reach_each_template_as_it_reads_them(real_template, name, as_string):
    from gateway.text.chat_template import arguments_as_string

    source = real_template(name)
    assert arguments_as_string(source) is as_string
    out = render(source, TWO_TURNS, tools=[WEATHER])
    assert "get_weather" in out and "18 C" in out
    assert '"city": "Paris"' in out and "'city'" not in out  # JSON, never Python's repr
    assert '\\"city\\"' not in out  # nor a JSON string written inside JSON


@pytest.mark.parametrize("name", [
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2MoE", "Kimi-K3", "Reka-Edge",  # {% break %} / {% continue %}
    "LFM2.5-8B-A1B", "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2",  # {% generation %}
])
def test_templates_with_loop_controls_and_generation_blocks_render(real_template, name):
    """Hugging Face renders these with Jinja's loop controls and its own ``{% generation %}``
    tag (a training mask: its body is rendered as is); so does the gateway."""
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And Rome?"}]
    out = render(real_template(name), conversation, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert out.index("Be brief.") < out.index("Weather in Paris?") < out.index("Sunny.") < out.index("And Rome?")
    assert "generation" not in out
    with_tools = render(real_template(name), TWO_TURNS, tools=[WEATHER], add_generation_prompt=True)
    assert "get_weather" in with_tools and "18 C" in with_tools


def test_generation_blocks_render_their_body():
    source = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% if loop.index > 1 %}" \
             "{% break %}{% endif %}{% endfor %}"
    assert render(source, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}]) == "[a][b]"
