"""``output_flows``: a cluster's start waits until every engine's output reaches the client."""

import pytest

from mpinb.client import _health


class _Probe:
    def __init__(self, answered: bool, heard: bool, error: Exception | None = None) -> None:
        self.answered, self.heard, self.error = answered, heard, error

    def wait_for_output(self, timeout: float) -> bool:
        assert timeout == 0  # a look, never a wait: one engine's lost output must not hold up the others
        return self.heard

    def ready(self) -> bool:
        return self.answered

    def successful(self) -> bool:
        return self.error is None

    def get(self):
        if self.error is not None:
            raise self.error


class _Engine:
    def __init__(self, deaf_probes: int = 0, answers: bool = True, error: Exception | None = None) -> None:
        self.deaf_probes = deaf_probes  # how many probes' output is lost before one is heard
        self.answers, self.error = answers, error
        self.sent = 0

    def apply_async(self, f):
        self.sent += 1
        heard = self.answers and self.error is None and self.sent > self.deaf_probes
        return _Probe(self.answers, heard, self.error)


class _Client:
    def __init__(self, engines: dict[int, _Engine]) -> None:
        self.engines = engines

    def __getitem__(self, eid: int) -> _Engine:
        return self.engines[eid]


def test_returns_after_one_probe_each_when_output_flows() -> None:
    client = _Client({7: _Engine(), 3: _Engine()})
    _health.output_flows(client, [7, 3], timeout=5)
    assert [e.sent for e in client.engines.values()] == [1, 1]


def test_probes_again_each_rank_whose_output_was_lost(monkeypatch) -> None:
    monkeypatch.setattr(_health, "_OUTPUT_PROBE_EVERY", 0.01)
    client = _Client({0: _Engine(), 1: _Engine(deaf_probes=3)})  # rank 1's first three probes' output is dropped
    _health.output_flows(client, [0, 1], timeout=5)
    assert client.engines[0].sent == 1 and client.engines[1].sent == 4


def test_names_the_ranks_never_heard() -> None:
    client = _Client({10: _Engine(), 11: _Engine(deaf_probes=10**9), 12: _Engine(deaf_probes=10**9)})
    with pytest.raises(RuntimeError, match=r"the engines of ranks 1-2 answer requests, but their output .* in 0 s"):
        _health.output_flows(client, [10, 11, 12], timeout=0.2)
    assert client.engines[10].sent == 1 and client.engines[11].sent >= 1


def test_an_engine_that_does_not_answer_is_called_silent_not_deaf() -> None:
    client = _Client({0: _Engine(), 1: _Engine(answers=False)})
    with pytest.raises(RuntimeError, match=r"the engines of rank 1 did not answer within 0 s"):
        _health.output_flows(client, [0, 1], timeout=0.1)


def test_an_engine_that_died_raises_its_error_at_once() -> None:
    died = RuntimeError("engine 1 died")
    client = _Client({0: _Engine(), 1: _Engine(error=died)})
    with pytest.raises(RuntimeError, match="engine 1 died"):
        _health.output_flows(client, [0, 1], timeout=60)
    assert client.engines[1].sent == 1
