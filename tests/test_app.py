import pytest
from openapi import validate

from gateway.app import create_app
from gateway.models.config import load_config
from gateway.serving.registry import Registry


@pytest.fixture
def config(write_config, model_dir):
    return load_config(write_config(f"""
        server:
          models_dirs: [{model_dir}]
        models:
          chat:
            path: {model_dir}/plain.gguf
            aliases: [Chat:Latest]
    """))


async def test_health(aiohttp_client, config):
    client = await aiohttp_client(create_app(config))
    r = await client.get("/health")
    assert r.status == 200
    body = await r.json()
    assert body["status"] == "ok" and body["models"] == 3  # chat is plain.gguf: one model, not two


async def test_v1_models_is_openai_list_shape(aiohttp_client, config):
    client = await aiohttp_client(create_app(config))
    r = await client.get("/v1/models")
    assert r.status == 200
    body = await r.json()
    validate(body, "ListModelsResponse")
    assert [m["id"] for m in body["data"]] == ["chat", "loop", "thinker"]
    for m in body["data"]:
        assert m["object"] == "model" and isinstance(m["created"], int) and m["created"] > 0


def test_registry_resolves_names_and_aliases_case_insensitively(config):
    reg = Registry(config)
    assert reg.resolve("  CHAT ").name == "chat"
    assert reg.resolve("chat:latest").name == "chat"
    assert reg.resolve("Thinker").source == "discovered"
    assert reg.resolve("plain").name == "chat"  # the configured entry's file, found on disk too
    for bad in ("nope", "../plain", "plain.gguf", str(config.models[0].path), "", None, 42):
        assert reg.resolve(bad) is None


def test_configured_name_wins_over_a_discovered_one(write_config, model_dir):
    cfg = load_config(write_config(f"""
        server:
          models_dirs: [{model_dir}]
        models:
          plain: {model_dir}/loop.gguf
    """))
    assert Registry(cfg).resolve("plain").path == model_dir / "loop.gguf"


def test_demo_model_only_when_nothing_is_configured_or_found(tmp_path, model_dir):
    empty = load_config(None)
    assert Registry(empty).specs() == []
    demo = Registry(empty, demo_dir=tmp_path, allow_demo=True).specs()
    assert [(s.name, s.source, s.path) for s in demo] == [("demo", "demo", tmp_path / "demo.gguf")]
    assert (tmp_path / "demo.gguf").read_bytes()[:4] == b"GGUF"


async def test_unknown_route_and_method_answer_in_openai_shape(aiohttp_client, config):
    client = await aiohttp_client(create_app(config))
    r = await client.get("/v1/nothing-here")
    assert r.status == 404
    body = await r.json()
    validate(body, "ErrorResponse")
    assert body["error"]["code"] == "not_found"
    r = await client.delete("/v1/models")
    assert r.status == 405
    validate(await r.json(), "ErrorResponse")


async def test_api_keys(aiohttp_client, write_config, model_dir):
    cfg = load_config(write_config(f"server:\n  models_dirs: [{model_dir}]\n  api_keys: [k1, k2]\n"))
    client = await aiohttp_client(create_app(cfg))
    assert (await client.get("/health")).status == 200
    r = await client.get("/v1/models")
    assert r.status == 401
    validate(await r.json(), "ErrorResponse")
    assert (await client.get("/v1/models", headers={"Authorization": "Bearer wrong"})).status == 401
    assert (await client.get("/v1/models", headers={"Authorization": "Bearer K1"})).status == 401
    assert (await client.get("/v1/models", headers={"Authorization": "Bearer k2"})).status == 200
    assert (await client.get("/v1/models", headers={"x-api-key": "k1"})).status == 200
    r = await client.get("/v1/messages", headers={"x-api-key": "bad"})
    body = await r.json()
    assert r.status == 401 and body == {"type": "error", "error": {"type": "authentication_error",
                                                                    "message": "Invalid or missing API key"}}
