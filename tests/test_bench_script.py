"""scripts/bench.py runs end to end (on a tiny scripted model, the gateway only) and writes
every figure it promises. It asserts no speed: the figures are the script's to report."""

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from helpers import REPO

from gateway.models import testmodels as tm


@pytest.mark.slow
def test_bench_script_measures_every_figure(tmp_path):
    model = tm.plain(tmp_path / "plain.gguf").path
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--only", "gateway", "--model", str(model),
                        "--threads", "1", "--tokens", "8", "--repeats", "2", "--long-prompt", "40",
                        "--overhead-requests", "12", "--stream-interval", "0,5", "--rpc", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"gateway 0ms", "gateway 5ms"}  # one contender per stream interval
    for g in data["results"].values():
        check_figures(g)
    assert "| decode tok/s, 1 stream" in r.stdout and "gateway 5ms" in r.stdout
    assert re.search(r"\(\d+\.\d\dx \[\d+\.\d\d\.\.\d+\.\d\d\]\)", r.stdout)  # a per-round ratio and its spread
    hop = data["hop"]["gateway"]  # a gateway in front of a gateway, against the inner one alone
    for side in ("direct", "hop"):
        assert hop[side]["decode_tok_s"] > 0 and hop[side]["ttft_ms"] > 0
        assert 0 < hop[side]["overhead_p50_ms"] <= hop[side]["overhead_p95_ms"]
    assert "one hop: a gateway in front of gateway" in r.stdout
    for side in ("whole", "split"):  # the model over two loopback rpc-servers, and whole
        assert data["rpc"][side]["decode_tok_s"] > 0 and len(data["rpc"][side]["rounds"]["ttft_ms"]) == 2
    assert "llama.cpp RPC: all layers on two rpc-servers" in r.stdout


@pytest.mark.slow
def test_the_access_benchmark_compares_keys_and_usage_with_neither(tmp_path):
    out = tmp_path / "access.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--access", "--access-rounds", "1",
                        "--access-requests", "5", "--access-spends", "2000", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["access"]
    servers = data["servers"]
    assert list(servers) == ["open, no usage", "open", "keys + limits + usage"]
    for name, s in servers.items():
        assert 0 < s["p50_ms"] <= s["p95_ms"] and len(s["rounds"]["p50_ms"]) == 1
        # every request sent was recorded, once: to the file, or in memory where usage_db is off
        assert s["recorded"]["requests"] == s["sent"] == 35, (name, s["recorded"])
        assert s["recorded"]["recording"] is (name != "open, no usage")
    assert servers["open"]["recorded"]["keys"] == ["anonymous"]
    assert servers["keys + limits + usage"]["recorded"]["keys"] == ["bench"]
    for name in ("open", "keys + limits + usage"):
        vs = servers[name]["vs_base"]
        assert vs["p50_ratio"]["min"] <= vs["p50_ratio"]["median"] <= vs["p50_ratio"]["max"]
    assert isinstance(data["target_met"], bool)
    store = data["store"]
    assert store["counted"] == 2000 and store["rows"] == 750 and store["record_us"] > 0 and store["spends_per_s"] > 0
    assert "| keys + limits + usage" in r.stdout and "target, keys + limits + usage at most 0.1 ms" in r.stdout
    assert "spends/s recorded" in r.stdout


@pytest.mark.slow
def test_the_cost_benchmark_cuts_a_request_into_its_parts(tmp_path):
    out = tmp_path / "cost.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--cost", "--only", "gateway",
                        "--cost-rounds", "1", "--cost-requests", "20", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["cost"]
    other = [] if importlib.util.find_spec("uvloop") is None else ["gateway (uvloop)"]  # the loop not the default's
    assert list(data["servers"]) == ["gateway", "gateway (probed)", *other]  # --only gateway: no llama-server
    for s in data["servers"].values():
        assert 0 < s["p50_ms"] <= s["p95_ms"] and len(s["rounds"]["p50_ms"]) == 1
    b = data["breakdown"]
    assert b["requests"] == 20 and b["total_us"] > 0
    rows = b["rows_us"]  # every seam was stamped: the gateway's, the worker's, both pipes
    for row in ("aiohttp: HTTP parse, request, handler task", "body: read, strict JSON, checks",
                "pipe -> worker: written, the worker's loop wakes",
                "worker: decode step (llama_decode, sample, done)", "pipe -> gateway: written, the loop wakes",
                "record: metrics, inference event, live series", "gateway -> client: written, the client reads"):
        assert rows[row] > 0, row
    assert "where the time goes" in r.stdout and "the probes' own cost" in r.stdout


@pytest.mark.slow
def test_the_observe_benchmark_sets_captures_and_traces_against_neither(tmp_path):
    out = tmp_path / "observe.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--observe", "--observe-rounds", "1",
                        "--observe-requests", "10", "--observe-seconds", "0.2", "--observe-tokens", "20",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["observe"]
    servers = data["servers"]
    assert list(servers) == ["off", "off again", "capture", "tracing"]
    for name, s in servers.items():
        assert 0 < s["p50_ms"] <= s["p95_ms"] and s["aggregate_tok_s"] > 0, name
        assert len(s["rounds"]["aggregate_tok_s"]) == 1
    for name in ("off again", "capture", "tracing"):
        vs = servers[name]["vs_off"]
        for k in ("p50_diff_ms", "p50_ratio", "aggregate_ratio"):
            assert vs[k]["min"] <= vs[k]["median"] <= vs[k]["max"], (name, k)
    # every request the tracing gateway was sent reached the sink as a trace, once it stopped;
    # every request the capture gateway was sent was captured
    assert data["valid"] and data["exports"]["traces"] == data["exports"]["sent"] == servers["tracing"]["sent"]
    assert data["exports"]["spans"] > data["exports"]["traces"] and data["exports"]["bytes"] > 0
    assert data["captured"]["made"] == data["captured"]["sent"] == servers["capture"]["sent"]
    assert {"p50_met", "aggregate_met"} <= set(data["targets"]["tracing"]) and set(data["targets"]) == {
        "capture", "tracing"}
    assert "| tracing" in r.stdout and "target, tracing at most 0.2 ms p50 and 2% of the aggregate" in r.stdout
    assert "A/A, two identical gateways" in r.stdout and "INVALID" not in r.stdout


def check_figures(g: dict) -> None:
    assert g["decode_tok_s"] > 0 and g["ttft_ms"] > 0
    assert set(g["aggregate_tok_s"]) == {"1", "2", "4", "8"} and all(v > 0 for v in g["aggregate_tok_s"].values())
    assert g["long_prompt_tokens"] > 40 and g["cold_ttft_ms"] > 0 and g["warm_ttft_ms"] > 0
    assert 0 < g["overhead"]["p50_ms"] <= g["overhead"]["p95_ms"]
    assert 0 < g["rss_idle_kib"] and 0 < g["rss_kib"] < g["rss_all_kib"]
    rounds = g["rounds"]  # every ratio comes from figures of the same round
    assert {"decode_tok_s", "ttft_ms", "cold_ttft_ms", "warm_ttft_ms", "overhead_p50_ms"} <= set(rounds)
    assert all(len(v) >= 1 and all(x > 0 for x in v) for v in rounds.values())


@pytest.mark.slow
def test_the_swap_benchmark_runs_and_reports_each_turn(tmp_path):
    a = tm.plain(tmp_path / "a.gguf").path
    b = tm.thinking(tmp_path / "b.gguf").path
    out = tmp_path / "swap.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--swap", "--model", str(a),
                        "--model-b", str(b), "--history", "300", "--swaps", "2", "--swap-tokens", "4",
                        "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["swap"]
    assert [t["model"] for t in data["gateway"]] == ["a", "b", "a", "b"]
    saved, plain = data["gateway + saved caches"], data["gateway"]
    assert all(t["ttft_s"] > 0 for t in saved + plain)
    # each returning turn found its whole history restored, and without saved caches none
    assert all(t["cached"] > 0.8 * t["prompt_tokens"] for t in saved[2:]) and all(not t["cached"] for t in plain)
    assert "| 3 | a |" in r.stdout and "returning turns (swaps), total s" in r.stdout


def test_the_memory_benchmark_sets_each_estimate_beside_llama_cpps_allocation(tmp_path):
    model = tm.plain(tmp_path / "plain.gguf").path
    out = tmp_path / "memory.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--memory", "--model", str(model),
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["memory"]
    assert any(d["kind"] == "cpu" for d in data["devices"])
    assert len(data["rows"]) == 4  # defaults, half the layers on a GPU, more slots, none on a GPU
    for row in data["rows"]:
        ram = row["pools"]["ram"]
        assert ram["estimate"] > 0 and ram["allocated"] > 0
    assert "| plain.gguf | defaults | ram |" in r.stdout and "estimated / allocated" in r.stdout


def test_the_speculation_benchmark_runs_each_workload_with_and_without(tmp_path):
    model = tm.endless(tmp_path / "loop.gguf").path
    out = tmp_path / "spec.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--speculation", "--only", "gateway",
                        "--model", str(model), "--spec-draft", str(model), "--spec-draft-max", "4", "--tokens", "24",
                        "--rounds", "1", "--threads", "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["speculation"]
    assert set(data) == {"gateway", "gateway, ngram", "gateway, draft model", "gateway, default"}
    for name, per in data.items():
        assert set(per) == {"editing", "chat", "4 streams", "4 answers", "4 continuations"}
        for workload, rounds in per.items():
            (one,) = rounds
            assert one["tokens"] > 0 and one["tok_s"] > 0
            if name == "gateway":
                assert one["drafted"] is None
            elif name != "gateway, default" and not workload.startswith("4 "):  # four unproven streams do not draft
                assert (one["drafted"] or 0) > 0
    assert "greedy answers of the gateway, draft model against the gateway without: 5 of 5 the same" in r.stdout


def test_the_lora_benchmark_measures_switching_and_streams_over_two_adapters(tmp_path):
    model = tm.endless(tmp_path / "loop.gguf").path
    out = tmp_path / "lora.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--lora", "--only", "gateway",
                        "--model", str(model), "--lora-rounds", "1", "--lora-requests", "4", "--lora-tokens", "8",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["lora"]
    assert list(data) == ["gateway"]  # --only gateway: no llama-server
    g = data["gateway"]
    assert 0 < g["same_p50_ms"] <= g["same_p95_ms"] and 0 < g["alternating_p50_ms"] <= g["alternating_p95_ms"]
    assert g["one_set_tok_s"] > 0 and g["two_sets_tok_s"] > 0 and len(g["rounds"]["two_over_one"]) == 1
    assert g["per_switch_ms"] == g["alternating_p50_ms"] - g["same_p50_ms"]
    assert "| gateway |" in r.stdout and "2 sets / 1 set" in r.stdout


@pytest.mark.slow
def test_the_tools_benchmark_sets_the_loop_against_a_client_and_cuts_a_round(tmp_path):
    out = tmp_path / "tools.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--tools", "--tools-rounds", "2",
                        "--tools-real-rounds", "0", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())["tools"]["scripted"]
    assert s["rounds"] == 2
    for k in ("loop_ms", "by_hand_ms", "by_hand_requests_ms", "client_search_ms"):
        assert 0 < s[k]["min"] <= s[k]["median"] <= s[k]["max"], k
    b = s["breakdown"]  # every looped answer cut at the loop's seams, the worker's and the stand-in's
    assert b["answers"] == 2 and b["round_less_tool_us"]["median"] > 0
    for row in ("1st generation's end: pipe, read, call held and parsed", "writer: the server_tool_use frame",
                "web_search: HTTP to the stand-in and back", "writer's result frame, the token cut",
                "worker: prompt rendered and tokenized", "  of which the stand-in's own handler"):
        assert b["rows_us"][row] > 0, row
    assert "loop / by hand:" in r.stdout and "the gateway's part of a round" in r.stdout


@pytest.mark.slow
def test_the_socket_benchmark_sets_a_websocket_session_against_streamed_posts(tmp_path):
    out = tmp_path / "socket.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--socket", "--socket-rounds", "2",
                        "--socket-real-rounds", "0", "--socket-turns", "3", "--socket-compacts", "1",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(out.read_text())["socket"]
    assert "real" not in s  # --socket-real-rounds 0
    got = s["scripted"]
    assert got["rounds"] == 2 and got["turns"] == 3
    assert list(got["ways"]) == ["SDK, SSE", "SDK, socket", "raw, SSE", "raw, socket"]
    for way, w in got["ways"].items():
        for k in ("first_event_ms", "end_ms", "session_ms"):
            assert 0 < w[k]["min"] <= w[k]["median"] <= w[k]["max"], (way, k)
        assert w["first_event_ms"]["median"] <= w["end_ms"]["median"]
        assert [len(x) for x in w["rounds"]["end_ms"]] == [3, 3]  # every turn of every session
        assert ("open_ms" in w) is way.endswith("socket")
    # both paths give the same events a turn (the socket's are the SSE stream's)
    assert len({w["events_per_turn"] for w in got["ways"].values()}) == 1
    for pair in ("SDK", "raw"):
        for k in ("first_event", "end", "session"):
            x = got["ratios"][pair][k]
            assert 0 < x["min"] <= x["median"] <= x["max"], (pair, k)
    c = got["compact"]
    assert c["times"] == 1 and c["ms"]["median"] > 0 and c["input_tokens"] > 0 and c["output_tokens"] > 0
    assert "socket / SSE, the same client" in r.stdout and "compaction of the 3-turn history" in r.stdout
    assert "llama-server: not measured; it has no Responses API state" in r.stdout


@pytest.mark.slow
def test_the_fairness_benchmark_runs_its_three_scenes_against_a_baseline(tmp_path):
    model = tm.endless(tmp_path / "loop.gguf").path  # answers as long as asked, in microseconds a token
    out = tmp_path / "fair.json"
    # this checkout as its own baseline (an A/A): the baseline's path is run, whatever commit it is
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--fairness", "--model", str(model),
                        "--baseline", str(REPO), "--fair-requests", "6", "--fair-tokens", "24", "--fair-b-alone", "2",
                        "--fair-seconds", "4", "--fair-rounds", "2", "--fair-overhead-requests", "20",
                        "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())["fairness"]
    assert list(data["two_keys"]) == ["fair queues", "first come (baseline)"]
    for scene in data["two_keys"].values():
        assert scene["errors"] == [] and scene["a_answer_s"]["n"] == 6 and scene["b_alone_ttft_s"]["n"] == 2
        assert scene["b_ttft_s"]["n"] >= 1 and 0 < scene["b_ttft_s"]["p50"] <= scene["b_ttft_s"]["p95"]
        assert isinstance(scene["target_met"], bool)
    three = data["three_models"]
    assert list(three) == ["fair queues", "fair queues, hold 0 (llama-swap)", "first come (baseline)"]
    for label, scene in three.items():  # three models with room for one: served throughout, no deadlock
        assert scene["stuck"] == 0 and scene["requests"] > 3, (label, scene["errors"][:1])
        assert not scene["errors"], (label, scene["errors"][:3])  # no swap unloads a model under a request
        assert scene["loads"] >= 3 and scene["swaps"] == scene["loads"] - 1
        assert set(scene["wait_by_model_s"]) == {"a", "b", "c"} and scene["wait_s"]["max"] < 30
    assert three["fair queues, hold 0 (llama-swap)"]["swaps_over_llama_swap"] == 1
    one = data["one_token"]
    assert one["p50_diff_ms"]["min"] <= one["p50_diff_ms"]["median"] <= one["p50_diff_ms"]["max"]
    assert len(one["rounds"]["fair queues"]) == 2 and isinstance(one["target_met"], bool)
    assert "two keys, one model with 2 slots" in r.stdout and "/ llama-swap's" in r.stdout
    assert "1-token completion on the tiny scripted model, 2 interleaved rounds" in r.stdout
