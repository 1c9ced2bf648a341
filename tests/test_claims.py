"""A request's claim on a busy model (``access/claims.py``): the priority its body asks, what it
may ask under its key, and the keys' settings behind it (``weight``, ``priority``, ``may_load``)
as the configuration and the keys file read them, bad ones refused naming the field."""

from __future__ import annotations

import contextvars

import pytest

from gateway.access import claims
from gateway.access.claims import CLAIM, NOBODY, Claim, Priority, Terms, asked, claim_of
from gateway.base.errors import InvalidRequest
from gateway.models.config import ConfigError, load_config

HI, N, B = Priority.INTERACTIVE, Priority.NORMAL, Priority.BATCH


@pytest.mark.parametrize("body, priority", [
    ({}, None),
    ({"priority": "interactive"}, HI), ({"priority": "normal"}, N), ({"priority": "batch"}, B),
    ({"priority": None}, None),  # null: as if unsaid
    ({"service_tier": "flex"}, B), ({"service_tier": "priority"}, HI),  # OpenAI's tiers where they mean one
    ({"service_tier": "auto"}, None), ({"service_tier": "default"}, None), ({"service_tier": "scale"}, None),
    ({"service_tier": 5}, None),
    ({"priority": "normal", "service_tier": "flex"}, N),  # the gateway's own field wins
])
def test_asked(body, priority):
    assert asked(body) == priority


@pytest.mark.parametrize("value", [7, "urgent", "Interactive", " batch", True, ["batch"], {"p": 1}, 0, ""])
def test_a_bad_priority_is_a_400_naming_it(value):
    with pytest.raises(InvalidRequest) as e:
        asked({"priority": value})
    assert e.value.status == 400 and e.value.param == "priority"
    assert "interactive, normal, batch" in e.value.message and "Traceback" not in e.value.message


@pytest.mark.parametrize("key_priority, asks, waits_at", [
    (N, None, N), (N, B, B), (N, HI, N),  # lower, never higher
    (B, HI, B), (B, N, B), (B, B, B),
    (HI, None, HI), (HI, N, N), (HI, B, B),
])
def test_a_request_may_lower_its_keys_priority_never_raise_it(key_priority, asks, waits_at):
    c = Claim("k", "k", Terms(priority=key_priority), asked=asks)
    assert c.priority() == waits_at
    # the key's terms as in force now (a reload), not as the request was admitted
    assert Claim("k", "k", Terms(priority=B), asked=asks).priority(Terms(priority=key_priority)) == waits_at


@pytest.mark.parametrize("asks, waits_at", [(None, N), (HI, HI), (N, N), (B, B)])
def test_without_a_key_a_request_may_ask_any_priority(asks, waits_at):
    assert Claim("addr:1.2.3.4", asked=asks).priority() == waits_at


def test_asking_twice_keeps_the_lower():
    c = Claim("k", "k", Terms(priority=HI))
    assert c.asking(B).asking(HI).priority() == B
    assert c.asking(N).priority() == N


def test_ask_lowers_the_claim_for_the_rest_of_the_task():
    def in_a_request() -> tuple[Claim, Claim]:
        CLAIM.set(Claim("k", "k", Terms(priority=HI)))
        claims.ask({"service_tier": "flex"})
        lowered = CLAIM.get()
        claims.ask({"priority": "interactive"})  # asks higher again: stays batch
        claims.ask(["not", "an", "object"])  # a body of another shape: nothing
        return lowered, CLAIM.get()

    lowered, after = contextvars.copy_context().run(in_a_request)
    assert lowered.priority() == B and after.priority() == B
    assert CLAIM.get() is NOBODY  # the request's own context only


def test_claim_of_a_key_and_of_an_address():
    cfg_key = claim_of(None, "10.0.0.7")
    assert (cfg_key.share, cfg_key.key, cfg_key.label, cfg_key.terms) == ("addr:10.0.0.7", None, "anonymous", Terms())
    assert claim_of(None, None).share == "addr:-"


# --- the keys' settings ---------------------------------------------------------------------
def problems_of(path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return e.value.problems


def test_a_keys_weight_priority_and_may_load_are_read_from_the_section_and_the_keys_file(write_config, tmp_path):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("ci:\n  key: ci-key\n  weight: 0.5\n  priority: batch\n  may_load: false\n"
                         "ed: {key: ed-key, role: user, weight: 1000, priority: interactive}\n")
    cfg = load_config(write_config(f"server:\n  api_keys_file: {keys_file}\n  api_keys:\n    root: r-key\n"
                                   "    light: {key: l-key, role: admin, weight: 0.001}\n"))
    keys = {k.name: k for k in cfg.server.api_keys}
    assert (keys["ci"].weight, keys["ci"].priority, keys["ci"].may_load) == (0.5, "batch", False)
    assert keys["ci"].role == "user"  # batch, or may_load false: something said of it, so not an admin by omission
    assert (keys["ed"].weight, keys["ed"].priority, keys["ed"].may_load) == (1000.0, "interactive", True)
    assert (keys["root"].weight, keys["root"].priority, keys["root"].may_load) == (1.0, "normal", True)
    assert keys["light"].weight == 0.001
    assert claim_of(keys["ci"], "1.2.3.4") == Claim("ci", "ci", Terms(0.5, B, False), named=True)


BAD = [
    ("weight: 0", "weight", "a number >= 0.001 and <= 1000"),
    ("weight: -1", "weight", "a number >= 0.001"),
    ("weight: 1e308", "weight", "<= 1000"),
    ("weight: 1.0e+308", "weight", "<= 1000"),
    ("weight: 1001", "weight", "<= 1000"),
    ("weight: .nan", "weight", "a number"),
    ("weight: .inf", "weight", "a number"),
    ("weight: x", "weight", "a number"),
    ("weight: true", "weight", "a number"),
    ("priority: urgent", "priority", "must be one of interactive, normal, batch"),
    ("priority: 1", "priority", "must be one of interactive, normal, batch"),
    ("may_load: 'yes'", "may_load", "must be true or false"),
    ("may_load: 1", "may_load", "must be true or false"),
]


@pytest.mark.parametrize("setting, field, said", BAD)
def test_a_bad_key_setting_in_the_section_is_refused_naming_it(write_config, setting, field, said):
    (line,) = problems_of(write_config(f"server:\n  api_keys:\n    root: r\n    x: {{key: k, {setting}}}\n"))
    assert f"server.api_keys.x.{field}" in line and said in line, line


@pytest.mark.parametrize("setting, field, said", BAD)
def test_a_bad_key_setting_in_the_keys_file_is_refused_naming_it(write_config, tmp_path, setting, field, said):
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(f"root: r-key\nx:\n  key: k\n  {setting}\n")
    (line,) = problems_of(write_config(f"server:\n  api_keys_file: {keys_file}\n"))
    assert str(keys_file) in line and field in line and said in line, line
