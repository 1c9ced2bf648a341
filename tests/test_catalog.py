"""The catalog alone: names -> specs from models.yaml, discovery and the demo, no server."""

import shutil

import pytest

from gateway.models import testmodels as tm
from gateway.models.catalog import DEMO_NAME, ModelCatalog
from gateway.models.config import load_config


def test_models_yaml_beats_discovery_and_a_tag_falls_back(tmp_path, write_config):
    store = tmp_path / "store"
    store.mkdir()
    tm.plain(store / "alpha.gguf")
    tm.plain(store / "beta.gguf")
    config = load_config(write_config(f"server:\n  discover_default_stores: false\n  models_dirs: [{store}]\n"
                                      f"models:\n  alpha:\n    path: {store}/beta.gguf\n    aliases: [First]\n"))
    catalog = ModelCatalog(config)
    assert catalog.resolve("ALPHA ").path.name == "beta.gguf"  # the configured entry, not the file named alpha
    assert catalog.resolve("first").name == "alpha" and catalog.resolve("first:latest").name == "alpha"
    assert catalog.resolve("beta").name == "alpha"  # the configured file's store name reaches its entry
    assert catalog.resolve("llama").path.name == "alpha.gguf"  # name taken: the architecture, last resort
    assert catalog.resolve("../alpha") is None and catalog.resolve(None) is None and catalog.resolve(" ") is None
    assert catalog.keys("Llama3:8B") == ["llama3:8b", "llama3"]
    assert {s.name for s in catalog.specs()} == {"alpha", "llama"}
    assert catalog.names_of(catalog.resolve("alpha"))[:2] == ["alpha", "first"]


def test_rescans_are_paced_and_find_new_files(tmp_path, write_config):
    config = load_config(write_config(f"server:\n  discover_default_stores: false\n  models_dirs: [{tmp_path}]\n"))
    paced, eager = ModelCatalog(config, rescan_seconds=3600), ModelCatalog(config, rescan_seconds=0)
    assert not paced.stale() and eager.stale()
    tm.plain(tmp_path / "late.gguf")
    assert eager.resolve("late") is None  # nothing is read until a refresh
    eager.refresh()
    assert eager.resolve("late").path == tmp_path / "late.gguf"


def test_the_demo_only_when_nothing_else_and_only_when_asked(tmp_path, write_config):
    config = load_config(write_config("server:\n  discover_default_stores: false\n"))
    assert ModelCatalog(config).specs() == []
    catalog = ModelCatalog(config, demo_dir=tmp_path, allow_demo=True)
    assert [s.name for s in catalog.specs()] == [DEMO_NAME] and catalog.resolve("demo").source == "demo"
    shutil.copy(catalog.resolve("demo").path, tmp_path / "other.gguf")
    config = load_config(write_config(f"models:\n  other: {tmp_path}/other.gguf\nserver:\n  discover_default_stores: false\n"))
    assert [s.name for s in ModelCatalog(config, demo_dir=tmp_path, allow_demo=True).specs()] == ["other"]


def test_a_link_dropped_into_a_folder_does_not_take_a_models_name(tmp_path, write_config):
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    tm.plain(store / "llama-chat.gguf")
    tm.plain(elsewhere / "other.gguf", ["Other"])
    # sorts before the real file, at the same depth: by path alone it would win the name
    (store / "LLAMA-CHAT.gguf").symlink_to(elsewhere / "other.gguf")
    (store / "a-link.gguf").symlink_to(store / "llama-chat.gguf")  # a second path to the same file
    config = load_config(write_config(f"server:\n  discover_default_stores: false\n  models_dirs: [{store}]\n"))
    catalog = ModelCatalog(config)
    assert catalog.resolve("llama-chat").path == store / "llama-chat.gguf"
    # the file is listed by its own path, not through the link that sorts first
    assert catalog.resolve("a-link") is None
    # a link that claims no taken name still serves (the usual ln -s of a big file)
    (store / "LLAMA-CHAT.gguf").unlink()
    (store / "mine.gguf").symlink_to(elsewhere / "other.gguf")
    catalog = ModelCatalog(config, rescan_seconds=0)
    assert catalog.resolve("mine").path == store / "mine.gguf"


def test_a_glob_alias_answers_for_the_names_no_model_has(tmp_path, write_config):
    """Claude Code asks for claude-sonnet-..., Codex for gpt-...: models.yaml maps them by pattern."""
    store = tmp_path / "store"
    store.mkdir()
    for name in ("coder", "chat", "gpt-oss-20b"):
        tm.plain(store / f"{name}.gguf")
    config = load_config(write_config(
        f"server:\n  discover_default_stores: false\n  models_dirs: [{store}]\n"
        f"models:\n  coder:\n    path: {store}/coder.gguf\n    aliases: ['claude-*', 'GPT-*']\n"
        f"  chat:\n    path: {store}/chat.gguf\n    aliases: ['claude-haiku-*', '*']\n"))
    catalog = ModelCatalog(config)
    assert catalog.resolve("claude-sonnet-4-5-20250929").name == "coder"
    assert catalog.resolve("claude-haiku-4-5").name == "coder"  # the first pattern in the file wins
    assert catalog.resolve("gpt-5-codex").name == "coder"  # compared lower-cased
    assert catalog.resolve("gpt-oss-20b").path.name == "gpt-oss-20b.gguf"  # a model's own name first
    assert catalog.resolve("anything-else").name == "chat"  # "*": every name no model has
    assert "claude-*" not in catalog.names_of(catalog.resolve("coder"))


def test_a_draft_named_by_a_model_name_is_that_models_file(tmp_path, write_config):
    store = tmp_path / "store"
    store.mkdir()
    tm.plain(store / "small-draft.gguf")
    tm.plain(tmp_path / "big.gguf")
    config = load_config(write_config(
        f"server:\n  discover_default_stores: false\n  models_dirs: [{store}]\n"
        f"models:\n  big:\n    path: {tmp_path}/big.gguf\n    draft: small-draft\n"
        f"  other:\n    path: {tmp_path}/big.gguf\n    draft: {store}/small-draft.gguf\n    aliases: [o]\n"
        f"  lost:\n    path: {tmp_path}/big.gguf\n    draft: nowhere-to-be-found\n"))
    catalog = ModelCatalog(config)
    assert catalog.resolve("big").draft == store / "small-draft.gguf"  # discovery's name, resolved
    assert catalog.resolve("o").draft == store / "small-draft.gguf"  # a path, as given
    lost = catalog.resolve("lost")
    assert str(lost.draft) == "nowhere-to-be-found" and not lost.draft.is_absolute()

    from gateway.backends.local import load_params
    from gateway.worker.drafting import draft_params

    with pytest.raises(RuntimeError, match="neither a file nor a model this gateway serves"):
        draft_params(load_params(lost, config.server), 512, 1)
