"""A model's replicas (gateway/replicas.py) with stand-in backends: which replica a request goes
to, failing over before the first event, a replica that dies and comes back after its back-off,
and the set going away only with its last replica. Real upstreams and workers behind the same
calls: test_upstream_e2e.py."""

from pathlib import Path

import pytest
from workerevents import until

from gateway import protocol
from gateway.backends.local import CHAT, EMBEDDINGS, StartFailed
from gateway.backends.replicas import ReplicaSet
from gateway.backends.workerclient import RequestFailed
from gateway.base.errors import ApiError
from gateway.models.config import ModelSpec


class Gen:
    """A generation whose first event is given."""

    def __init__(self, backend, first):
        self.backend, self.first, self.on_idle, self.closed = backend, first, None, False

    async def next(self):
        return self.first

    def close(self):
        self.closed = True
        self.backend.live -= 1


class StandIn:
    serves = frozenset({CHAT})
    device = "cpu"
    pid = None
    busy = False

    def __init__(self, name, first):
        self.name, self.first, self.info, self.alive, self.live = name, first, {"name": name}, True, 0

    @property
    def in_flight(self):
        return self.live

    def generate(self, request):
        self.live += 1
        return Gen(self, self.first)

    async def stop(self, timeout=5.0):
        self.alive = False

    def set_threads(self, n):
        pass

    def abort_all(self, message):
        pass


START = protocol.Start(0, 1, 0, 0)
CRASHED = protocol.Error(0, 500, "gone", None, "worker_crashed")
REFUSED = protocol.Error(0, 400, "too long", "messages", "context_length_exceeded")


def spec(n=2, parallel=1):
    members = tuple(ModelSpec(f"m#{i}", Path(f"m{i}.gguf"), parallel=parallel) for i in range(1, n + 1))
    return ModelSpec("m", replicas=members, parallel=n * parallel)


async def start(firsts, fail=(), exits=None, backoff=(0.05, 0.05)):
    started, exit_callbacks = {}, {}

    async def starter(member, on_exit):
        if member.name in fail:
            raise StartFailed(f"{member.name} broke")
        backend = started[member.name] = StandIn(member.name, firsts[member.name])
        exit_callbacks[member.name] = lambda: on_exit(backend, False)
        return backend

    replicas = await ReplicaSet.start(spec(len(firsts)), starter, exits or (lambda b, e: None), backoff)
    return replicas, started, exit_callbacks


async def test_the_replica_with_most_free_capacity_answers():
    replicas, started, _ = await start({"m#1": START, "m#2": START})
    first = replicas.generate(protocol.GenerationRequest())
    assert await first.next() == START and started["m#1"].live == 1  # equals: the listed order
    second = replicas.generate(protocol.GenerationRequest())
    assert await second.next() == START and started["m#2"].live == 1  # m#1 is full now
    first.close()
    assert [m.spec.name for m in replicas.order()] == ["m#1", "m#2"]


async def test_a_failure_before_the_first_event_moves_the_request_and_a_refusal_does_not():
    replicas, started, _ = await start({"m#1": CRASHED, "m#2": START})
    gen = replicas.generate(protocol.GenerationRequest())
    assert await gen.next() == START
    assert [(m.requests, m.failovers) for m in replicas.members] == [(1, 1), (1, 0)]
    assert started["m#1"].live == 0  # the failed generation was closed
    refused, _, _ = await start({"m#1": REFUSED, "m#2": START})
    assert await refused.generate(protocol.GenerationRequest()).next() == REFUSED  # the caller's mistake stays


async def test_a_replica_that_died_serves_again_after_its_back_off():
    exited = []
    replicas, started, exits = await start({"m#1": START, "m#2": START}, exits=lambda b, e: exited.append(b))
    exits["m#1"]()
    assert replicas.alive and exited == [] and [m.spec.name for m in replicas.order()] == ["m#2"]
    def back() -> bool:  # the back-off is 50 ms; the next requests start it again
        replicas.order()
        return replicas.members[0].backend is not None

    await until(back, "m#1 started again after its back-off")
    assert [m.spec.name for m in replicas.order()] == ["m#1", "m#2"]
    exits["m#1"]()
    exits["m#2"]()
    assert exited == [replicas] and not replicas.alive  # the set is gone with its last replica


async def test_the_set_starts_with_some_replicas_and_fails_with_none():
    replicas, _, _ = await start({"m#1": START, "m#2": START}, fail={"m#1"})
    assert [m.spec.name for m in replicas.order()] == ["m#2"] and "m#1 broke" in replicas.members[0].error
    with pytest.raises(StartFailed, match="no replica started: m#1: m#1 broke; m#2: m#2 broke"):
        await start({"m#1": START, "m#2": START}, fail={"m#1", "m#2"})
    none_ready = await start({"m#1": START}, fail=())
    none_ready[2]["m#1"]()
    event = await none_ready[0].generate(protocol.GenerationRequest()).next()
    assert event.status == 503 and event.code == "upstream_unavailable"


async def test_a_question_fails_over_when_a_local_replica_refuses_it_as_unavailable():
    replicas, started, _ = await start({"m#1": START, "m#2": START})

    async def gone(inputs):
        raise RequestFailed(protocol.Error(0, 503, "not running", None, "model_unavailable"))

    async def answers(inputs):
        return protocol.Embeddings(0, [[1.0]], 1)

    started["m#1"].embed, started["m#2"].embed = gone, answers
    started["m#1"].serves = started["m#2"].serves = frozenset({EMBEDDINGS})
    assert (await replicas.embed(["x"])).data == [[1.0]]
    assert [(m.requests, m.failovers) for m in replicas.members] == [(1, 1), (1, 0)]

    async def refuses(inputs):
        raise RequestFailed(protocol.Error(0, 400, "too long", "input", "context_length_exceeded"))

    started["m#1"].embed = refuses
    with pytest.raises(ApiError) as e:  # the caller's mistake is not passed on
        await replicas.embed(["x"])
    assert e.value.status == 400 and e.value.param == "input"
