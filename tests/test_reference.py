"""models.yaml's generated schema and reference (``models/config/reference.py``): the files are
what the generator makes now, the schema takes the example file, and the schema and the loader
(``check-config``) agree on a corpus of valid and invalid files, the config tests' own."""

import json
import re
import subprocess
import sys

import jsonschema
import pytest
import test_config
import test_lora_config
import test_model_settings
import yaml
from helpers import REPO
from test_llama_settings import SAMPLES

from gateway.models.config import ConfigError, hostedtools, keys, load_config, models, reference, server
from gateway.protocol import settings
from gateway.text.sampling_params import SAMPLING

sys.path.insert(0, str(REPO / "scripts"))
import gen_docs  # noqa: E402

VALIDATOR = jsonschema.Draft202012Validator(reference.schema())


def as_json(data):
    """YAML's data as a JSON document holds it (a date as its ISO text, as a YAML editor reads it)."""
    return json.loads(json.dumps(data, default=str))


def schema_valid(text: str) -> bool:
    return VALIDATOR.is_valid(as_json(yaml.safe_load(text)))


def loader_valid(tmp_path, text: str) -> bool:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    try:
        load_config(path, check_files=False)
    except ConfigError:
        return False
    return True


def test_the_generated_files_are_up_to_date():
    for path, text in gen_docs.outputs().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run {gen_docs.COMMAND}"


def test_the_schema_is_a_draft_2020_12_schema_and_takes_the_example_file():
    jsonschema.Draft202012Validator.check_schema(reference.schema())
    text = (REPO / "models.yaml.example").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=docs/models.yaml.schema.json"
    VALIDATOR.validate(as_json(yaml.safe_load(text)))


def test_gguf_gateway_schema_prints_the_file():
    out = subprocess.run([sys.executable, "-m", "gateway", "schema"], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    assert json.loads(out) == json.loads((REPO / "docs" / "models.yaml.schema.json").read_text())


def _params(test) -> list:
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    return list(mark.args[1])


# Files the loader refuses for what a schema cannot say: a check across values or files.
BEYOND_SCHEMA = {
    "models:\n  Qwen: a.gguf\n  other:\n    path: b.gguf\n    aliases: [QWEN]\n": "a name used twice",
    "models:\n  m:\n    path: m.gguf\n    n_batch: 256\n    n_ubatch: 512\n": "n_ubatch compared with n_batch",
    "models:\n  m: {upstream: 'http://box:99999/v1'}\n": "a port past 65535 inside a URL",
    "models:\n  m:\n    path: m.gguf\n    devices: [CUDA0, cuda0]\n": "device names compared without case",
    "models:\n  m:\n    path: m.gguf\n    loras: {pirate: p.gguf, PIRATE: q.gguf}\n": "adapter names without case",
    "server:\n  api_keys: {alice: {key: k1, rpm: 5}}\n": "keys with no admin (the role rule)",
}


# Files YAML can write and JSON cannot: what an editor's schema check never sees.
NOT_JSON = {"models:\n  m:\n    path: m.gguf\n    loras: {pirate: {path: p.gguf, scale: .nan}}\n": "NaN",
            "models:\n  m:\n    path: m.gguf\n    loras: {7: p.gguf}\n": "a mapping key that is not a string"}
# Keys the pool below leaves out: the loader reads the file they name, or compares them with another key.
POOL_LEFT_OUT = {("server", "api_keys_file"): "the loader reads the file", ("upstream", "api_key_file"): (
    "the loader reads the file"), ("local", "n_ubatch"): "compared with n_batch"}


def _entry(entry: str) -> str:
    return "models:\n  m:\n    path: m.gguf\n" + "".join(f"    {line}\n" for line in entry.splitlines())


INVALID = ([body for body, _ in _params(test_config.test_type_errors_name_the_file_and_yaml_path)]
           + [body for body, _ in _params(test_config.test_unknown_keys_are_errors)]
           + [f"models:\n  m: {entry}\n" for entry, _ in _params(test_config.test_upstream_and_replica_mistakes_are_named)]
           + [_entry(entry) for entry, _, _ in _params(test_model_settings.test_each_setting_is_checked_with_its_place)]
           + [_entry(entry) for entry, _, _ in _params(test_lora_config.test_each_adapter_mistake_is_named_with_its_place)
              if "loras" in entry]
           + [f"models:\n  m:\n    path: m.gguf\n    draft_p_min: {v}\n"
              for v in _params(test_config.test_draft_p_min_is_a_probability)]
           + ["models:\n  m:\n    path: m.gguf\n    cache_type_v: q8_0\n    flash_attn: false\n",
              "models:\n  m:\n    path: m.gguf\n    reasoning: ['<r>', '<r>']\n",
              "models:\n  m: {replicas: [{path: a.gguf, loras: {x: x.gguf}}]}\n",
              "models:\n  m: {upstream: 'http://box/v1', loras: {x: x.gguf}}\n",
              "server:\n  api_keys: [SHA256:abc]\n", "server:\n  memory_reserve: 100%\n", "m: 42\n", "m:\n"])
VALID = ["", "server:\n", "models:\n", "m: a.gguf\n", (REPO / "models.yaml.example").read_text(),
         yaml.safe_dump({"models": {"m": {"path": "m.gguf", **{k: w for k, (w, _) in SAMPLES.items()}}}}),
         "models:\n  m: {replicas: [a.gguf, {path: b.gguf, n_ctx: 8}, {upstream: 'http://b/v1', parallel: 2}]}\n",
         "server:\n  api_keys: {a: {key: k1, role: admin}, b: {key: k2, rpm: 3, expires: 2027-01-31}}\n",
         "server:\n  memory_reserve: {ram: 4GiB, cuda0: 10%}\n  capture: {keep: true}\n  otel: false\n",
         "models:\n  m:\n    path: m.gguf\n    reasoning: ['<r>', '</r>']\n    keep_alive: 1h30m\n"]


@pytest.mark.parametrize("text", [t for t in INVALID if t not in BEYOND_SCHEMA and t not in NOT_JSON])
def test_the_schema_refuses_what_the_loader_refuses(tmp_path, text):
    assert not loader_valid(tmp_path, text)
    assert not schema_valid(text)


@pytest.mark.parametrize("text", VALID)
def test_the_schema_takes_what_the_loader_takes(tmp_path, text):
    assert loader_valid(tmp_path, text)
    assert schema_valid(text)


@pytest.mark.parametrize("text", list(BEYOND_SCHEMA))
def test_what_only_the_loader_sees_is_its_own(tmp_path, text):
    assert schema_valid(text) and not loader_valid(tmp_path, text)


POOL = [True, 0, -1, 1, 3, 1.5, 70000, "x", " ", "5m", "1GiB", "10%", "none", "q8_0", "box:1", "http://h/v1",
        [], ["a"], [1, 0], {}, {"a": 1}, None]


@pytest.mark.parametrize("where, key", [
    (w, k) for w, k in [("server", k) for k in server.SERVER if k != "api_keys"] + [("local", k) for k in models.LOCAL]
    + [("upstream", k) for k in models.UPSTREAM] if (w, k) not in POOL_LEFT_OUT])
def test_schema_and_loader_agree_on_every_key_over_a_pool_of_values(tmp_path, where, key):
    for value in POOL:
        if where == "server":
            data = {"server": {key: value}}
        else:
            base = {"path": "m.gguf"} if where == "local" else {"upstream": "http://h/v1"}
            data = {"models": {"m": {**base, key: value}}}
        text = yaml.safe_dump(data)
        assert loader_valid(tmp_path, text) == schema_valid(text), (where, key, value)


def test_every_declared_key_is_in_the_reference_once():
    text = (REPO / "docs" / "configuration.md").read_text()
    rows, section = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif m := re.match(r"\| `([^`]+)` \|", line):
            rows.append((section, m.group(1)))
    assert len(rows) == len(set(rows))
    declared = ({("server", k) for k in server.SERVER} | {("server", f"capture.{k}") for k in server._CAPTURE}
                | {("server", f"otel.{k}") for k in server._OTEL} | {("keys", k) for k in keys.SETTINGS}
                | {("server", f"mcp_servers.NAME.{k}") for k in hostedtools._SERVER}
                | {("server", f"web_search.{k}") for k in hostedtools._SEARCH}
                | {("model: any kind", k) for k in models.COMMON}
                | {("model: any kind", f"defaults.{k}") for k in SAMPLING}
                | {("model: local", k) for k in models.LOCAL if k not in models.COMMON and k != "loras"}
                | {("loras", k) for k in ("loras", "loras.NAME.path", "loras.NAME.scale")}
                | {("model: upstream", k) for k in models.UPSTREAM if k not in models.COMMON}
                | {("model: upstream", f"timeouts.{k}") for k in ("connect", "first_byte", "idle")}
                | {("model: replicas", "replicas")})
    assert set(rows) == declared
    assert {k for _, k in rows} >= {f.name for f in settings.SETTINGS}
    assert "| `n_ctx` | integer >= 1 | unset | `-c, --ctx-size` | `num_ctx` |" in text
