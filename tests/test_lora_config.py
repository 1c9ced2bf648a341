"""models.yaml's ``loras:``: the LoRA adapters a request names as MODEL:ADAPTER, each checked where it
is written (``models/config/models.py``), and the pure names module that reads such a request
(``models/adapternames.py``) with the catalog's use of it."""

from pathlib import Path

import pytest
from helpers import REPO

from gateway.base.errors import ApiError
from gateway.models import adapternames
from gateway.models.config import (
    MAX_ADAPTER_NAME,
    MAX_ADAPTERS,
    AdapterSpec,
    ConfigError,
    ModelSpec,
    adapter_name_problem,
    load_config,
)
from gateway.serving.registry import Registry


def configured(spec) -> list[str]:
    """The adapters a spec itself names (its ``loras``): ``resolve``'s ``adapters_of`` here."""
    return [a.name for a in spec.loras]


def problems_of(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return e.value.problems


def test_loras_map_names_to_files_relative_to_the_config_with_their_scales(write_config, tmp_path):
    cfg = load_config(write_config("""
        models:
          m:
            path: m.gguf
            loras:
              concise: adapters/concise.gguf
              Pirate: {path: /x/pirate.gguf, scale: 0.5}
              negative: {path: neg.gguf, scale: -1}
    """), check_files=False)
    (spec,) = cfg.models
    assert [(a.name, a.path, a.scale, a.source) for a in spec.loras] == [
        ("concise", tmp_path / "adapters" / "concise.gguf", 1.0, "models.yaml"),
        ("Pirate", Path("/x/pirate.gguf"), 0.5, "models.yaml"),
        ("negative", tmp_path / "neg.gguf", -1.0, "models.yaml")]
    assert spec.lora == ()  # the always-applied list is another setting
    assert ModelSpec(name="x", path=Path("/m.gguf")).loras == ()


@pytest.mark.parametrize(("entry", "where", "says"), [
    ("loras: [a.gguf]", "models.m.loras", "must map each adapter's name to its GGUF file"),
    ("loras: {pirate: {path: p.gguf, scale: big}}", "models.m.loras.pirate.scale", "must be a number"),
    ("loras: {pirate: {path: p.gguf, scale: true}}", "models.m.loras.pirate.scale", "must be a number"),
    ("loras: {pirate: {path: p.gguf, scale: .nan}}", "models.m.loras.pirate.scale", "must be a number"),
    ("loras: {pirate: {path: p.gguf, scale: .inf}}", "models.m.loras.pirate.scale", "must be a number"),
    ("loras: {pirate: {path: p.gguf, scale: 100.5}}", "models.m.loras.pirate.scale", "from -100 to 100"),
    ("loras: {pirate: {path: p.gguf, scale: -101}}", "models.m.loras.pirate.scale", "from -100 to 100"),
    ("loras: {pirate: {scale: 0.5}}", "models.m.loras.pirate.path", "is required"),
    ("loras: {pirate: {path: p.gguf, rank: 8}}", "models.m.loras.pirate.rank", "unknown key"),
    ("loras: {pirate: 3}", "models.m.loras.pirate", "must be the adapter's GGUF file"),
    ("loras: {pirate: null}", "models.m.loras.pirate", "must be the adapter's GGUF file"),
    ("loras: {pirate: ''}", "models.m.loras.pirate.path", "must be a file path"),
    ("loras: {'a:b': p.gguf}", "models.m.loras.a:b", "never ':'"),
    ("loras: {'a/b': p.gguf}", "models.m.loras.a/b", "letters, digits"),
    ("loras: {'two words': p.gguf}", "models.m.loras.two words", "letters, digits"),
    ("loras: {'': p.gguf}", "models.m.loras.", "non-empty string"),
    ("loras: {7: p.gguf}", "models.m.loras.7", "non-empty string"),
    (f"loras: {{{'n' * (MAX_ADAPTER_NAME + 1)}: p.gguf}}", f"models.m.loras.{'n' * (MAX_ADAPTER_NAME + 1)}",
     f"at most {MAX_ADAPTER_NAME} characters"),
    ("loras: {pirate: p.gguf, PIRATE: q.gguf}", "models.m.loras.PIRATE", "named twice"),
])
def test_each_adapter_mistake_is_named_with_its_place(write_config, entry, where, says):
    found = problems_of(write_config(f"models:\n  m:\n    path: m.gguf\n    {entry}\n"))
    assert any(f"models.yaml: {where}: " in p and says in p for p in found), found


def test_every_problem_of_the_adapters_is_told_at_once(write_config):
    found = problems_of(write_config("models:\n  m:\n    path: m.gguf\n"
                                     "    loras: {a: {path: a.gguf, scale: x}, 'b:c': b.gguf, d: {scale: 1}}\n"))
    assert [p.split("models.yaml: ", 1)[1].split(":")[0] for p in found] == [
        "models.m.loras.a.scale", "models.m.loras.b", "models.m.loras.d.path"], found


def test_a_model_takes_at_most_max_adapters(write_config):
    many = ", ".join(f"a{i}: a{i}.gguf" for i in range(MAX_ADAPTERS))
    cfg = load_config(write_config(f"models:\n  m:\n    path: m.gguf\n    loras: {{{many}}}\n"), check_files=False)
    assert len(cfg.models[0].loras) == MAX_ADAPTERS
    (line,) = problems_of(write_config(f"models:\n  m:\n    path: m.gguf\n    loras: {{{many}, one_more: x.gguf}}\n"))
    assert f"models.m.loras: names {MAX_ADAPTERS + 1} adapters: a model takes at most {MAX_ADAPTERS}" in line


@pytest.mark.parametrize(("entry", "where", "says"), [
    ("{upstream: 'http://box:8080/v1', loras: {a: a.gguf}}", "models.m.loras", "an upstream's own adapters"),
    ("{replicas: [/x.gguf, /y.gguf], loras: {a: a.gguf}}", "models.m.loras", "a replica set sends a request"),
    ("{replicas: [{path: /x.gguf, loras: {a: a.gguf}}]}", "models.m.replicas[0].loras", "a replica set sends"),
    ("{replicas: [{upstream: 'http://box', loras: {a: a.gguf}}]}", "models.m.replicas[0].loras", "a replica set"),
])
def test_loras_on_what_runs_no_worker_here_are_refused_with_the_reason(write_config, entry, where, says):
    (line,) = problems_of(write_config(f"models:\n  m: {entry}\n"))
    assert f"{where}: " in line and says in line, line


def test_a_missing_adapter_file_is_a_warning_like_lora_s(write_config, tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "here.gguf").write_bytes(b"GGUF")
    path = write_config("models:\n  m:\n    path: m.gguf\n    loras: {here: here.gguf, gone: {path: gone.gguf}}\n")
    cfg = load_config(path)
    assert cfg.warnings == (f"{path}: models.m: LoRA adapter 'gone' not found: {tmp_path / 'gone.gguf'}",)
    assert [a.name for a in cfg.models[0].loras] == ["here", "gone"]  # the model still serves
    assert load_config(path, check_files=False).warnings == ()


def test_the_example_file_names_adapters_for_llama3():
    cfg = load_config(REPO / "models.yaml.example", check_files=False)
    llama3 = next(m for m in cfg.models if m.name == "llama3")
    assert [(a.name, a.scale) for a in llama3.loras] == [("concise", 1.0), ("pirate", 0.5)]
    assert all(a.path.is_absolute() and a.path.name.endswith("-lora.gguf") for a in llama3.loras)


@pytest.mark.parametrize(("name", "ok"), [
    ("pirate", True), ("Pirate_v2.1+fix-3", True), ("海盗", True), ("n" * MAX_ADAPTER_NAME, True),
    ("n" * (MAX_ADAPTER_NAME + 1), False), ("", False), ("  ", False), ("a:b", False), ("a/b", False),
    ("a b", False), ("a#1", False), ("a*", False), ("a\x1b", False), (None, False), (3, False),
])
def test_what_an_adapter_may_be_called(name, ok):
    assert (adapter_name_problem(name) is None) is ok


# --- adapternames: reading a request's model name ------------------------------------------------

def spec(name: str, *adapters: str, aliases: tuple[str, ...] = ()) -> ModelSpec:
    return ModelSpec(name=name, path=Path(f"/m/{name}.gguf"), aliases=aliases,
                     loras=tuple(AdapterSpec(a, Path(f"/a/{a}.gguf")) for a in adapters))


def catalog_of(*specs: ModelSpec):
    """A lookup by name or alias (trimmed, without case), as a catalog's."""
    table = {n.lower(): s for s in specs for n in s.names}
    return lambda name: table.get(name.strip().lower())


QWEN = spec("qwen3", "Pirate", "concise")
LLAMA = spec("llama3.2:3b", "pirate", aliases=("llama3.2",))
SOLO = spec("solo", "formal")
SPECS = (QWEN, LLAMA, SOLO)


@pytest.mark.parametrize(("name", "expected"), [
    ("qwen3:pirate", (QWEN, "Pirate")),  # the spec's own spelling comes back
    (" QWEN3:PIRATE ", (QWEN, "Pirate")),
    ("qwen3:concise", (QWEN, "concise")),
    ("llama3.2:3b:pirate", (LLAMA, "pirate")),  # split at the last ':': an Ollama tag stays the model's
    ("llama3.2:pirate", (LLAMA, "pirate")),  # by an alias
    ("solo:formal", (SOLO, "formal")),
    ("formal", (SOLO, "formal")),  # a bare name one model has
    ("FORMAL", (SOLO, "formal")),
    ("concise", (QWEN, "concise")),
    ("pirate", None),  # two models have it: no guess
    ("qwen3:formal", None),  # the model has no such adapter, though another has
    ("nobody:pirate", None),
    ("qwen3:", None), (":pirate", None), ("", None), ("   ", None),
    ("qwen3:pirate:extra", None),
    ("nothing", None),
])
def test_resolve_reads_base_and_adapter(name, expected):
    got = adapternames.resolve(name, catalog_of(*SPECS), configured, SPECS)
    assert got == expected if expected is None else (got is not None and got[0] is expected[0] and got[1] == expected[1])


def test_resolve_asks_only_what_it_is_given():
    """Adapters come from ``adapters_of`` (a registry adds those of run time), models from ``lookup``
    and ``specs``: none of them is read from anywhere else."""
    extra = {id(QWEN): ["styled"]}
    adapters_of = lambda s: configured(s) + extra.get(id(s), [])  # noqa: E731
    assert adapternames.resolve("qwen3:styled", catalog_of(*SPECS), adapters_of, SPECS)[1] == "styled"
    assert adapternames.resolve("styled", catalog_of(*SPECS), adapters_of, SPECS)[0] is QWEN
    assert adapternames.resolve("qwen3:styled", catalog_of(*SPECS), configured, SPECS) is None
    assert adapternames.resolve("formal", catalog_of(*SPECS), configured, (QWEN, LLAMA)) is None
    assert adapternames.resolve("formal", catalog_of(*SPECS), configured, (SOLO, SOLO))[0] is SOLO


def test_qualified_names_base_and_adapter():
    assert adapternames.qualified("llama3.2:3b", "pirate") == "llama3.2:3b:pirate"
    assert adapternames.resolve(adapternames.qualified(LLAMA.name, "pirate"), catalog_of(*SPECS),
                                configured, SPECS)[0] is LLAMA


@pytest.mark.parametrize(("stem", "name"), [
    ("pirate", "pirate"), ("Formal Tone", "formal-tone"), ("qwen3-8b-lora-F16", "qwen3-8b-lora-f16"),
    ("a:b/c", "a-b-c"), ("--x--", "x"), ("???", None), ("", None), ("y" * 200, "y" * MAX_ADAPTER_NAME),
])
def test_a_files_stem_becomes_an_adapters_name(stem, name):
    assert adapternames.from_stem(stem) == name


def test_a_request_name_picks_a_configured_models_adapter(write_config, tmp_path):
    cfg = load_config(write_config("""
        server: {discover_default_stores: false}
        models:
          qwen3: {path: q.gguf, loras: {pirate: p.gguf}, aliases: ["qwen3:latest"]}
          "x:pirate": {path: x.gguf}
          other: {path: o.gguf, loras: {formal: f.gguf}}
    """), check_files=False)
    registry = Registry(cfg)
    qwen3, other = registry.resolve("qwen3"), registry.resolve("other")
    assert registry.adapters.picked("qwen3:pirate") == (qwen3, "pirate")
    assert registry.adapters.picked("qwen3:latest:pirate") == (qwen3, "pirate")
    assert registry.adapters.picked("pirate") == (qwen3, "pirate")
    assert registry.adapters.picked("formal") == (other, "formal")
    assert registry.adapters.picked("x:pirate") is None  # a model's own name is no adapter
    assert registry.adapters.picked("qwen3:latest") is None and registry.adapters.picked("qwen3") is None
    assert registry.adapters.picked(None) is None
    with pytest.raises(ApiError) as err:  # a tag naming no adapter of a base that has some: a typo, likely
        registry.adapters.picked("other:pirate")
    assert err.value.status == 404 and "formal" in err.value.message
