"""Which model a fill-in-the-middle request without ``model`` goes to (llama.vscode and
llama.vim send none): the only model, else the only one whose GGUF header has FIM tokens,
else a 400 on ``model`` naming the candidates. The choice as a pure function, then on the
real `gguf-gateway serve` process with one FIM model among others."""

import pytest
from helpers import ServerProcess, request

from gateway.base.errors import InvalidRequest
from gateway.models import testmodels as tm
from gateway.wire import fim

FIM_SPECIAL = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
MIDDLE = [" return", " a", " +", " b"]


@pytest.mark.parametrize("candidates, chosen", [
    ([("chat", False)], "chat"),  # the only model answers for itself (a 400 if it cannot fill)
    ([("up", None)], "up"),
    ([("chat", False), ("coder", True), ("embed-like", None)], "coder"),
    ([("coder", True), ("chat", False)], "coder"),
])
def test_the_choice(candidates, chosen):
    assert fim.choose_model(candidates) == chosen


@pytest.mark.parametrize("candidates, named, unnamed", [
    ([("a", True), ("b", True), ("c", False)], ["a", "b"], ["c"]),
    ([("a", False), ("b", False)], [], []),
    ([("a", False), ("up", None)], ["up"], []),  # an upstream's model is not known to fill before it loads
])
def test_no_single_choice_is_a_400_naming_the_candidates(candidates, named, unnamed):
    with pytest.raises(InvalidRequest) as e:
        fim.choose_model(candidates)
    assert e.value.status == 400 and e.value.param == "model"
    assert all(n in e.value.message for n in named) and not any(f"{n}," in e.value.message for n in unnamed)


def test_a_model_field_that_is_not_a_name_is_still_refused():
    for body in ({"model": 5, "input_prefix": "a", "input_suffix": "b"}, {"model": " ", "input_prefix": "a",
                                                                          "input_suffix": "b"}):
        with pytest.raises(InvalidRequest) as e:
            fim.parse_infill(body)
        assert e.value.param == "model"
    assert fim.parse_fim({"prompt": "a", "suffix": "b"}).model == ""


@pytest.fixture(scope="module")
def editor(tmp_path_factory):
    """A gateway serving a chat model and one coder model, as someone coming from llama-server
    adds an editor's completion to a gateway that already serves chat."""
    d = tmp_path_factory.mktemp("fim-choice")
    tm.write_scripted_model(d / "coder.gguf", tm.Script(MIDDLE, trigger="<|fim_middle|>"), extra_special=FIM_SPECIAL,
                            fim_ids=True)  # the header names its FIM tokens: known before it loads
    tm.plain(d / "chat.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  chat: {d}/chat.gguf\n"
                   f"  coder: {d}/coder.gguf\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv


@pytest.mark.slow
def test_the_one_fim_model_answers_without_a_model_name(editor):
    status, body = request(editor.url + "/infill", {"input_prefix": "def add(a, b):\n", "input_suffix": "\n"})[:2]
    assert status == 200 and body["content"] == "".join(MIDDLE) and body["model"] == "coder", body
    status, body = request(editor.url + "/v1/fim/completions", {"prompt": "def add(a, b):\n", "suffix": "\n"})[:2]
    assert status == 200 and body["model"] == "coder", body
    assert body["choices"][0]["message"]["content"] == "".join(MIDDLE)
    # a route that needs `model` still needs it
    status, body = request(editor.url + "/v1/completions", {"prompt": "a", "suffix": "b"})[:2]
    assert status == 400 and body["error"]["param"] == "model"
