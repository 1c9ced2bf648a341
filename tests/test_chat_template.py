import pytest

from gateway.chat_template import CHATML, TemplateBroken, TemplateInputError, render

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
