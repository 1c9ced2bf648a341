from pathlib import Path

import pytest
from helpers import REPO

from gateway.models.config import ENV_CONFIG, ConfigError, find_config_path, load_config


def problems_of(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return e.value.problems


def test_full_form_short_form_and_aliases(write_config, model_dir):
    path = write_config(f"""
        server:
          host: 0.0.0.0
          port: 9000
          models_dirs: [{model_dir}]
          api_keys: [secret]
        models:
          short: {model_dir}/plain.gguf
          Long:
            path: {model_dir}/thinker.gguf
            aliases: ["long:8b", other]
            n_ctx: 8192
            n_gpu_layers: 0
            embeddings: true
    """)
    cfg = load_config(path)
    assert cfg.server.host == "0.0.0.0" and cfg.server.port == 9000
    assert cfg.server.models_dirs == (model_dir,)
    assert [(k.name, k.secret, k.role) for k in cfg.server.api_keys] == [("key1", "secret", "admin")]
    short, long_ = cfg.models
    assert (short.name, short.path, short.n_ctx, short.n_gpu_layers) == ("short", model_dir / "plain.gguf", None, -1)
    assert long_.name == "Long" and long_.aliases == ("long:8b", "other")
    assert (long_.n_ctx, long_.n_gpu_layers, long_.embeddings) == (8192, 0, True)
    assert cfg.warnings == ()


def test_defaults_without_a_file(_isolated_home):
    cfg = load_config(None)
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    assert cfg.server.models_dirs == () and cfg.server.discover_default_stores  # ~/models is a default store
    assert (cfg.server.keep_alive, cfg.server.load_timeout, cfg.server.max_loaded_models) == (300, 300, 3)
    assert cfg.models == ()


def test_empty_file_is_the_defaults(write_config):
    cfg = load_config(write_config(""))
    assert cfg.models == () and cfg.server.port == 8080


def test_older_layout_top_level_name_path_pairs(write_config, model_dir):
    cfg = load_config(write_config(f"""
        mistral: {model_dir}/plain.gguf
        server:
          port: 8081
    """))
    assert [(m.name, m.path) for m in cfg.models] == [("mistral", model_dir / "plain.gguf")]


def test_paths_expand_home_env_and_resolve_relative_to_the_file(write_config, tmp_path, monkeypatch, _isolated_home):
    monkeypatch.setenv("MODELS_AT", "/srv/models")
    cfg = load_config(write_config("""
        models:
          a: ~/m/a.gguf
          b: $MODELS_AT/b.gguf
          c: sub/c.gguf
          d: ../d.gguf
    """))
    paths = {m.name: m.path for m in cfg.models}
    assert paths == {
        "a": _isolated_home / "m" / "a.gguf",
        "b": Path("/srv/models/b.gguf"),
        "c": tmp_path / "sub" / "c.gguf",
        "d": tmp_path.parent / "d.gguf",
    }


@pytest.mark.parametrize("body, expected", [
    ("models:\n  llama3:\n    path: x.gguf\n    n_ctx: big\n",
     'models.llama3.n_ctx: must be a positive integer, got "big"'),
    ("models:\n  llama3:\n    path: x.gguf\n    n_ctx: 0\n", "models.llama3.n_ctx: must be a positive integer, got 0"),
    ("models:\n  m:\n    path: x.gguf\n    embeddings: yes please\n", 'models.m.embeddings: must be true or false'),
    ("models:\n  m:\n    path: x.gguf\n    n_gpu_layers: -2\n", "models.m.n_gpu_layers: must be an integer >= -1"),
    ("models:\n  m:\n    path: x.gguf\n    aliases: m2\n", 'models.m.aliases: must be a list, got "m2"'),
    ("models:\n  m:\n    path: x.gguf\n    defaults:\n      temperature: 5\n",
     "models.m.defaults.temperature: must be <= 2, got 5"),
    ("models:\n  m:\n    path: x.gguf\n    defaults:\n      top_k: 0.5\n",
     "models.m.defaults.top_k: must be an integer, got 0.5"),
    ("models:\n  m:\n    path: x.gguf\n    defaults:\n      temprature: 1\n", "models.m.defaults.temprature: unknown key"),
    ("models:\n  m:\n    path: x.gguf\n    n_threads: 0\n", "models.m.n_threads: must be a positive integer, got 0"),
    ("models:\n  m:\n    path: x.gguf\n    parallel: 65\n", "models.m.parallel: must be an integer from 1 to 64, got 65"),
    ("models:\n  m:\n    path: x.gguf\n    flash_attn: auto\n", 'models.m.flash_attn: must be true or false, got "auto"'),
    ("models:\n  m:\n    path: x.gguf\n    swa_full: 1\n", 'models.m.swa_full: must be true or false, got 1'),
    ("models:\n  m:\n    path: x.gguf\n    repack: yes please\n", 'models.m.repack: must be true or false, got "yes please"'),
    ("server:\n  port: 70000\n", "server.port: must be a port number (1-65535), got 70000"),
    ("server:\n  port: true\n", "server.port: must be a port number (1-65535), got true"),
    ("server:\n  models_dirs: ~/models\n", 'server.models_dirs: must be a list'),
    ("server:\n  keep_alive: soon\n", 'server.keep_alive: must be a duration'),
    ("server:\n  reasoning_fields: [thoughts]\n", 'server.reasoning_fields[0]: must be one of reasoning_content'),
    ("models:\n  m:\n    path: x.gguf\n    reasoning: deepthink\n", 'models.m.reasoning: must be one of auto, think'),
    ("server:\n  load_timeout: -1\n", "server.load_timeout: must be a number of seconds >= 0, got -1"),
    ("server:\n  max_loaded_models: -1\n", "server.max_loaded_models: must be an integer >= 0"),
    ("server:\n  discover_default_stores: maybe\n", "server.discover_default_stores: must be true or false"),
    ("server:\n  stream_interval_ms: -1\n", "server.stream_interval_ms: must be an integer from 0 to 1000, got -1"),
    ("server: [1]\n", "server: must be a mapping"),
    ("models: [a, b]\n", "models: must be a mapping"),
    ("models:\n  m: 42\n", "models.m: must be a file path or a mapping with `path` (or `upstream`, `replicas`), got 42"),
    ("models:\n  m:\n    aliases: [x]\n", "models.m.path: required"),
    ("- just\n- a list\n", "top level: must be a mapping"),
])
def test_type_errors_name_the_file_and_yaml_path(write_config, body, expected):
    path = write_config(body)
    (line,) = problems_of(path)
    assert line.startswith(f"{path}: ")
    assert expected in line


@pytest.mark.parametrize("body, where", [
    ("server:\n  prot: 8080\n", "server.prot: unknown key"),
    ("models:\n  m:\n    path: x.gguf\n    n_cxt: 10\n", "models.m.n_cxt: unknown key"),
    ("sever:\n  port: 1\n", "sever: unknown key"),
])
def test_unknown_keys_are_errors(write_config, body, where):
    (line,) = problems_of(write_config(body))
    assert where in line


def test_every_problem_is_reported_each_on_its_own_line(write_config):
    problems = problems_of(write_config("""
        server:
          port: x
          colour: blue
        models:
          a:
            path: a.gguf
            n_ctx: -5
          b: 7
    """))
    assert len(problems) == 4
    assert all("\n" not in p for p in problems)


def test_duplicate_names_and_aliases_are_errors(write_config):
    problems = problems_of(write_config("""
        models:
          Qwen: a.gguf
          other:
            path: b.gguf
            aliases: [QWEN]
    """))
    assert len(problems) == 1 and 'name "QWEN" is already used by models.Qwen' in problems[0]


def test_invalid_yaml_gives_the_position(write_config):
    path = write_config("models:\n  a: [unclosed\n")
    (line,) = problems_of(path)
    assert line.startswith(f"{path}: invalid YAML: line ")


def test_missing_model_file_is_a_warning_not_fatal(write_config, tmp_path):
    cfg = load_config(write_config("models:\n  gone: nowhere.gguf\n"))
    assert cfg.warnings == (f"{tmp_path / 'models.yaml'}: models.gone: model file not found: {tmp_path / 'nowhere.gguf'}",)


def test_unreadable_file(tmp_path):
    (line,) = problems_of(tmp_path / "absent.yaml")
    assert "absent.yaml: cannot read" in line


def test_where_the_config_comes_from(tmp_path, monkeypatch, _isolated_home):
    assert find_config_path(None) is None
    user = _isolated_home / ".config" / "gguf-gateway" / "models.yaml"
    user.parent.mkdir(parents=True)
    user.write_text("")
    assert find_config_path(None) == user
    monkeypatch.setenv(ENV_CONFIG, str(tmp_path / "env.yaml"))
    assert find_config_path(None) == tmp_path / "env.yaml"
    assert find_config_path(tmp_path / "flag.yaml") == tmp_path / "flag.yaml"


def test_the_example_file_loads_through_the_real_loader():
    cfg = load_config(REPO / "models.yaml.example", check_files=False)
    names = {n for m in cfg.models for n in m.names}
    assert {"qwen3", "llama3", "llama3:8b"} <= names
    llama3 = next(m for m in cfg.models if m.name == "llama3")
    assert (llama3.n_ctx, llama3.n_gpu_layers, llama3.embeddings) == (8192, -1, False)
    assert (llama3.n_threads, llama3.n_batch, llama3.flash_attn, llama3.use_mmap) == (8, 512, True, True)
    assert llama3.parallel == 4 and next(m for m in cfg.models if m.name == "qwen3").parallel == 4
    qwen3 = next(m for m in cfg.models if m.name == "qwen3")
    assert (llama3.repack, llama3.swa_full) == (qwen3.repack, qwen3.swa_full) == (False, True)  # the defaults
    assert llama3.defaults["temperature"] == 0.7 and llama3.defaults["max_tokens"] == 2048
    assert (llama3.keep_alive, llama3.preload) == (float("inf"), True)
    assert (cfg.server.keep_alive, cfg.server.load_timeout, cfg.server.max_loaded_models) == (300, 300, 3)
    assert cfg.server.discover_default_stores is True
    assert cfg.server.stream_interval_ms == 10 and cfg.server.upstream_check_seconds == 30
    split, desk, pool = (next(m for m in cfg.models if m.name == n) for n in ("big-split", "desk-gpu", "qwen3-any"))
    assert split.rpc == ("192.168.1.20:50052", "192.168.1.21:50052")
    assert desk.upstream.url == "http://gpu-box.lan:8080/v1" and desk.upstream.model == "qwen3-32b"
    assert [m.upstream is not None for m in pool.replicas] == [False, True] and "qwen3-pool" in pool.aliases
    assert cfg.server.reasoning_fields == ("reasoning_content", "reasoning") and llama3.reasoning == "auto"


def test_api_keys_from_a_map_a_file_and_the_environment(write_config, tmp_path, monkeypatch):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# one per line\nci=ci-key\nbare-key\n\n")
    monkeypatch.setenv("GGUF_GATEWAY_API_KEYS", "ops=ops-key, other-key")
    cfg = load_config(write_config(f"server:\n  api_keys: {{alice: a-key, bob: b-key}}\n  api_keys_file: {keys_file}\n"))
    assert [(k.name, k.secret) for k in cfg.server.api_keys] == [
        ("alice", "a-key"), ("bob", "b-key"), ("ci", "ci-key"), ("key4", "bare-key"), ("ops", "ops-key"),
        ("key6", "other-key")]
    (line,) = problems_of(write_config(f"server:\n  api_keys_file: {tmp_path}/missing\n"))
    assert "server.api_keys_file: cannot read" in line
    (line,) = problems_of(write_config("server:\n  api_keys: {alice: 5}\n"))
    assert "server.api_keys.alice.key: must be a non-empty string" in line


def test_an_unset_key_variable_warns_and_the_upstream_goes_without_a_key(write_config, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    cfg = load_config(write_config("models:\n  m: {upstream: 'http://box/v1', api_key_env: NOT_SET_ANYWHERE}\n"))
    assert cfg.models[0].upstream.api_key is None
    assert any("models.m.api_key_env: environment variable NOT_SET_ANYWHERE is not set" in w for w in cfg.warnings)


def test_upstreams_replicas_and_rpc(write_config, model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("BOX_KEY", "from-env")
    (tmp_path / "key").write_text("from-file\n")
    cfg = load_config(write_config(f"""
        models:
          far:
            upstream: http://box:8080
            model: qwen3:8b
            api_key_env: BOX_KEY
            timeouts: {{connect: 2, first_byte: 30, idle: 5}}
            max_connections: 4
            reasoning: think
          all-of-box:
            upstream: https://box.lan/api/v1/
            api_key_file: key
            upstream_discover: true
          pair:
            aliases: [p]
            replicas:
              - {model_dir}/plain.gguf
              - {{upstream: "http://other:1234/v1", api_key: sk-1, parallel: 8}}
          split:
            path: {model_dir}/plain.gguf
            rpc: ["10.0.0.2:50052", "gpu-box:50053"]
    """))
    far, box, pair, split = cfg.models
    assert far.path is None and not far.local and far.reasoning == "think"
    up = far.upstream
    assert (up.url, up.model, up.api_key) == ("http://box:8080/v1", "qwen3:8b", "from-env")
    assert (up.connect_timeout, up.first_byte_timeout, up.idle_timeout, up.max_connections) == (2, 30, 5, 4)
    assert "from-env" not in repr(far)  # a key is never shown
    assert box.upstream.url == "https://box.lan/api/v1" and box.upstream.api_key == "from-file"
    assert box.upstream.discover and box.upstream.prefix == "all-of-box/"
    assert [m.name for m in pair.replicas] == ["pair#1", "pair#2"] and pair.aliases == ("p",)
    assert pair.replicas[0].local and pair.replicas[1].upstream.api_key == "sk-1"
    assert pair.parallel == 4 + 8 and pair.members == pair.replicas and far.members == (far,)
    assert split.rpc == ("10.0.0.2:50052", "gpu-box:50053")


@pytest.mark.parametrize("entry, problem", [
    ("{upstream: ftp://box/v1}", "models.m.upstream: must be an http:// or https:// base URL"),
    ("{upstream: 'http://user:pw@box/v1'}", "no query, no credentials"),
    ("{upstream: 'http://box:99999/v1'}", "bad port"),
    ("{path: /x.gguf, upstream: 'http://box/v1'}", "needs exactly one of `path`"),
    ("{aliases: [x]}", "models.m.path: required"),
    ("{upstream: 'http://box/v1', n_ctx: 4}", "models.m.n_ctx: is for a local model"),
    ("{path: /x.gguf, api_key: k}", "models.m.api_key: is for an upstream"),
    ("{upstream: 'http://box/v1', api_key: k, api_key_env: K}", "give one of api_key, api_key_env"),
    ("{upstream: 'http://box/v1', timeouts: {connect: 0}}", "models.m.timeouts.connect: must be a number of seconds > 0"),
    ("{replicas: []}", "must list at least one replica"),
    ("{replicas: [{n_ctx: 4}]}", "models.m.replicas[0]: needs exactly one of `path` or `upstream`"),
    ("{replicas: [/x.gguf], n_ctx: 5}", "n_ctx: set these on each replica"),
    ("{path: /x.gguf, rpc: [box]}", "models.m.rpc[0]: must be host:port"),
])
def test_upstream_and_replica_mistakes_are_named(write_config, entry, problem):
    found = problems_of(write_config(f"models:\n  m: {entry}\n"))
    assert any(problem in p for p in found), found


def test_a_duration_past_any_float_is_a_mistake_not_a_crash(write_config):
    from gateway.models.config import parse_duration

    assert parse_duration(10 ** 400) is None and parse_duration(-1) == float("inf") and parse_duration(1e308) == 1e308
    found = problems_of(write_config(f"server:\n  keep_alive: {10 ** 400}\n"))
    assert any("server.keep_alive: must be a duration" in p for p in found), found


def test_missing_projector_draft_and_adapter_files_are_warnings(write_config, tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    cfg = load_config(write_config("models:\n  m:\n    path: m.gguf\n    mmproj: mm.gguf\n    draft: d.gguf\n"
                                   "    lora: [a.gguf]\n  n:\n    path: m.gguf\n    draft: m\n"))
    where = f"{tmp_path / 'models.yaml'}: models.m"
    assert cfg.warnings == (f"{where}: projector file (mmproj) not found: {tmp_path / 'mm.gguf'}",
                            f"{where}: draft model file not found: {tmp_path / 'd.gguf'}",
                            f"{where}: LoRA adapter not found: {tmp_path / 'a.gguf'}")  # a draft by name: the catalog's


@pytest.mark.parametrize("value", [1.5, -0.1, "high", True])
def test_draft_p_min_is_a_probability(write_config, value):
    (line,) = problems_of(write_config(f"models:\n  m:\n    path: m.gguf\n    draft_p_min: {value}\n"))
    assert "models.m.draft_p_min: must be a number from 0 to 1, got " in line


def test_a_keys_settings_its_role_rule_and_a_keys_file_of_digests(write_config, tmp_path):
    import datetime as dt
    import hashlib

    digest = hashlib.sha256(b"ci-secret").hexdigest()
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(f"ci:\n  key: sha256:{digest}\n  models: [gemma*]\n  rpm: 5\n  expires: 2027-01-31\n"
                         f"ops: sha256:{digest.upper()}\n")
    cfg = load_config(write_config(
        f"server:\n  api_keys_file: {keys_file}\n  api_keys:\n    me: my-key\n"
        "    laptop: {key: l-key, budget: 1000, budget_period: week}\n"
        "    boss: {key: b-key, role: admin, tpm: 10}\n"))
    keys = {k.name: k for k in cfg.server.api_keys}
    assert {n: k.role for n, k in keys.items()} == {"me": "admin", "laptop": "user", "boss": "admin",
                                                   "ci": "user", "ops": "admin"}
    assert keys["ci"].secret is None and keys["ci"].digest == hashlib.sha256(b"ci-secret").digest()
    assert keys["ci"].models == ("gemma*",) and keys["ci"].rpm == 5 and keys["ci"].expires == dt.datetime(2027, 1, 31, tzinfo=dt.timezone.utc).timestamp()
    assert keys["laptop"].budget == 1000 and keys["laptop"].budget_period == "week"
    assert cfg.server.keys_file == keys_file and "my-key" not in repr(cfg)
    # keys and no admin: refused, saying how to mend it
    (line,) = problems_of(write_config("server:\n  api_keys:\n    u: {key: k, rpm: 5}\n"))
    assert "no key is an admin" in line and "role: admin" in line
    for bad, said in (("{key: k, role: root}", "must be one of user, admin"), ("{key: k, rpm: 0}", "positive"),
                      ("{key: 'sha256:abc'}", "64 hex digits"), ("{key: k, expires: soon}", "date or time"),
                      ("{rpm: 5}", "needs `key`"), ("{key: k, budget_period: year}", "day, week, month"),
                      ("{key: k, colour: red}", "unknown key")):
        (line,) = problems_of(write_config(f"server:\n  api_keys:\n    root: r\n    x: {bad}\n"))
        assert said in line and "server.api_keys.x" in line, (bad, line)


def test_a_keys_file_too_large_or_too_deep_is_a_problem_not_a_crash(write_config, tmp_path):
    big, deep = tmp_path / "big.yaml", tmp_path / "deep.yaml"
    big.write_text("k: " + "x" * (5 << 20) + "\n")
    deep.write_text("k: " + "[" * 50_000 + "]" * 50_000 + "\n")
    for path, said in ((big, "larger than"), (deep, "nests too deeply")):
        (line,) = problems_of(write_config(f"server:\n  api_keys_file: {path}\n"))
        assert said in line and str(path) in line
