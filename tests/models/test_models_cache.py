"""The response cache: no repeat requests, resumable after an interruption, keys that separate runs."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence

import pytest

from assay.errors import UserError
from assay.models import (
    CachedModel,
    Conversation,
    GenerationParams,
    OnResult,
    ResponseCache,
    cache_key,
    load_model,
    user_turn,
)
from assay.models.cache import keys_after
from assay.models.stub_server import StubServer, serve_stub

PARAMS = GenerationParams(max_new_tokens=8)


class Counting:
    """A real ChatModel (no HTTP) that answers "<id>:<prompt>", counts what it was sent, and can fail
    after ``fail_after`` replies, the way a run dies halfway."""

    def __init__(self, model_id: str = "counting", fail_after: int | None = None) -> None:
        self.model_id = model_id
        self.fail_after = fail_after
        self.sent: list[str] = []

    def chat(
        self,
        conversations: Sequence[Conversation],
        params: GenerationParams,
        on_result: OnResult | None = None,
    ) -> list[str]:
        replies = []
        for index, conversation in enumerate(conversations):
            if self.fail_after is not None and len(self.sent) >= self.fail_after:
                raise KeyboardInterrupt  # what Ctrl-C looks like to the caller
            prompt = conversation[-1]["content"]
            self.sent.append(prompt)
            reply = f"{self.model_id}:{prompt}"
            replies.append(reply)
            if on_result is not None:
                on_result(index, reply)
        return replies


@pytest.fixture
def cache(tmp_path):
    with ResponseCache(tmp_path / "responses.sqlite") as opened:
        yield opened


def test_second_call_sends_no_request(cache):
    stub = StubServer()
    conversations = [user_turn(f"q{i}") for i in range(12)]
    with serve_stub(stub) as url:
        model = CachedModel(load_model(f"openai:{url}", model_name="stub-model"), cache)
        first = model.chat(conversations, PARAMS)
        assert stub.stats.chat_requests == 12
        reported: dict[int, str] = {}
        assert model.chat(conversations, PARAMS, reported.__setitem__) == first
        assert stub.stats.chat_requests == 12
    assert reported == dict(enumerate(first))
    assert len(cache) == 12


def test_interrupted_run_resumes_without_requerying(cache):
    conversations = [user_turn(f"q{i}") for i in range(10)]
    dying = Counting(fail_after=4)
    with pytest.raises(KeyboardInterrupt):
        CachedModel(dying, cache).chat(conversations, PARAMS)
    assert dying.sent == ["q0", "q1", "q2", "q3"] and len(cache) == 4

    resumed = Counting()
    replies = CachedModel(resumed, cache).chat(conversations, PARAMS)
    assert resumed.sent == [f"q{i}" for i in range(4, 10)]
    assert replies == [f"counting:q{i}" for i in range(10)]


def test_server_failure_halfway_keeps_received_replies(cache):
    """The server's model breaks after 5 answers; once it is back, the rerun asks only for the other 7."""
    state = {"answered": 0, "broken_after": 5}

    def flaky(messages):
        if state["answered"] >= state["broken_after"]:
            raise RuntimeError("model crashed")
        state["answered"] += 1
        return f"ok {messages[-1]['content']}"

    conversations = [user_turn(f"q{i}") for i in range(12)]
    stub = StubServer(flaky)
    with serve_stub(stub) as url:
        model = CachedModel(load_model(f"openai:{url}", model_name="stub-model", max_retries=0), cache)
        with pytest.raises(UserError, match="5 of 12 responses had arrived and were kept"):
            model.chat(conversations, PARAMS)
        assert len(cache) == 5

        state["broken_after"] = 10**9  # the server is healthy again
        before = stub.stats.status_counts[200]
        replies = model.chat(conversations, PARAMS)
        assert stub.stats.status_counts[200] - before == 7
    assert replies == [f"ok q{i}" for i in range(12)]
    assert sorted(stub.stats.prompts()) == sorted(f"q{i}" for i in range(12))  # each answered once


def test_identical_conversations_are_sent_once(cache):
    inner = Counting()
    conversations = [user_turn("a"), user_turn("b"), user_turn("a"), user_turn("a")]
    reported: list[int] = []
    replies = CachedModel(inner, cache).chat(conversations, PARAMS, lambda i, _: reported.append(i))
    assert inner.sent == ["a", "b"]
    assert replies == ["counting:a", "counting:b", "counting:a", "counting:a"]
    assert sorted(reported) == [0, 1, 2, 3]


def test_keys_are_the_sha256_of_the_whole_request_as_before() -> None:
    """``keys_after`` serialises the shared head once; its keys must equal hashing each request's whole
    JSON (the formula of earlier releases, so their caches keep answering)."""
    requests = [
        user_turn('é ü 漢字 "quoted" \\ back'),
        [{"role": "system", "content": "x"}, {"content": "y", "role": "user"}],
        ["a prompt", " a continuation"],
        {"z": 1, "a": [None, 1.5, True]},
        "plain",
        [],
    ]
    for shared in ([], ["m1"], ["m1", PARAMS.cache_key()], ["m1", "loglikelihood", None]):
        whole = [json.dumps([*shared, r], sort_keys=True, ensure_ascii=False) for r in requests]
        assert keys_after(shared, requests) == [hashlib.sha256(w.encode()).hexdigest() for w in whole]
    assert cache_key("m1", PARAMS, requests[0]) == keys_after(["m1", PARAMS.cache_key()], [requests[0]])[0]


def test_key_separates_models_params_and_conversations(cache):
    conversation = user_turn("same")
    keys = {
        cache_key("m1", PARAMS, conversation),
        cache_key("m2", PARAMS, conversation),
        cache_key("m1", GenerationParams(max_new_tokens=9), conversation),
        cache_key("m1", GenerationParams(max_new_tokens=8, seed=1), conversation),
        cache_key("m1", PARAMS, [{"role": "system", "content": "x"}, *conversation]),
    }
    assert len(keys) == 5
    assert cache_key("m1", PARAMS, conversation) == cache_key(
        "m1", GenerationParams(max_new_tokens=8), conversation
    )

    one, two = Counting("m1"), Counting("m2")
    assert CachedModel(one, cache).chat([conversation], PARAMS) == ["m1:same"]
    assert CachedModel(two, cache).chat([conversation], PARAMS) == ["m2:same"]
    assert CachedModel(one, cache).chat([conversation], GenerationParams(max_new_tokens=3)) == ["m1:same"]
    assert (len(one.sent), len(two.sent)) == (2, 1)
    assert CachedModel(Counting("m1"), cache).chat([conversation], PARAMS) == ["m1:same"]


def test_cache_file_is_wal_sqlite_with_timestamps(cache):
    CachedModel(Counting(), cache).chat([user_turn("x")], PARAMS)
    with sqlite3.connect(cache.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        key, model_id, response, created_at = db.execute(
            "SELECT key, model_id, response, created_at FROM responses"
        ).fetchone()
    assert len(key) == 64 and model_id == "counting" and response == "counting:x" and created_at > 0


def test_default_path_follows_assay_home(assay_home):
    with ResponseCache() as default:
        assert default.path == assay_home / "cache" / "responses.sqlite"
        assert default.path.exists()


WRAPPER = """
import os
CALLS = []
{identity}
def answer(prompts):
    CALLS.extend(prompts)
    return [os.environ["WEIGHTS"] + ":" + p for p in prompts]
"""


def test_a_python_wrapper_is_cached_under_its_declared_model_only(cache, tmp_path, monkeypatch):
    """One wrapper source serving two models (chosen by an environment variable): with ``MODEL_ID``
    read from the environment each model gets its own replies; without it nothing is cached at all."""
    named = tmp_path / "named.py"
    named.write_text(WRAPPER.format(identity='MODEL_ID = lambda: "weights=" + os.environ["WEIGHTS"]'))
    ask = [user_turn("q1"), user_turn("q2")]
    monkeypatch.setenv("WEIGHTS", "model-a")
    model_a = load_model(f"python:{named}:answer")
    assert CachedModel(model_a, cache).chat(ask, PARAMS) == ["model-a:q1", "model-a:q2"]
    assert CachedModel(model_a, cache).chat(ask, PARAMS) == ["model-a:q1", "model-a:q2"]
    monkeypatch.setenv("WEIGHTS", "model-b")
    model_b = load_model(f"python:{named}:answer")
    assert model_b.model_id != model_a.model_id and model_b.model_id.endswith("#weights=model-b")
    assert CachedModel(model_b, cache).chat(ask, PARAMS) == ["model-b:q1", "model-b:q2"]
    assert len(cache) == 4

    anonymous = tmp_path / "anonymous.py"
    anonymous.write_text(WRAPPER.format(identity=""))
    wrapped = CachedModel(load_model(f"python:{anonymous}:answer"), cache)
    assert not wrapped.caching
    assert wrapped.chat(ask, PARAMS) == ["model-b:q1", "model-b:q2"]
    monkeypatch.setenv("WEIGHTS", "model-c")
    assert wrapped.chat(ask, PARAMS) == ["model-c:q1", "model-c:q2"]  # asked again, not served from the cache
    assert len(cache) == 4  # nothing of the anonymous wrapper was stored


def test_bad_model_id_is_one_line(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("MODEL_ID = 3\ndef answer(prompts):\n    return prompts\n")
    with pytest.raises(UserError, match=r"MODEL_ID must be a non-empty string \(value: 3\)"):
        load_model(f"python:{module}:answer")


class Scoring(Counting):
    """Counting plus plain-text completion and a log-likelihood (minus the continuation's length)."""

    def complete(self, prompts, params, on_result=None):
        return self.chat([user_turn(p) for p in prompts], params, on_result)

    def loglikelihood(self, requests, on_result=None):
        self.sent.extend(f"{c}|{x}" for c, x in requests)
        scores = [-float(len(x)) for _, x in requests]
        for index, score in enumerate(scores):
            if on_result is not None:
                on_result(index, score)
        return scores


def test_completions_and_scores_are_cached_apart_from_chat(cache):
    inner = Scoring("m")
    model = CachedModel(inner, cache)
    assert model.chat([user_turn("p")], PARAMS) == ["m:p"]
    assert model.complete(["p"], PARAMS) == ["m:p"]  # same text, another kind of request: asked again
    assert model.loglikelihood([("p", " ab"), ("p", " a")]) == [-3.0, -2.0]
    assert inner.sent == ["p", "p", "p| ab", "p| a"]
    again = CachedModel(Scoring("m"), cache)
    assert again.complete(["p"], PARAMS) == ["m:p"]
    assert again.loglikelihood([("p", " a"), ("p", " ab")]) == [-2.0, -3.0]
    assert again.model.sent == []
    with pytest.raises(UserError, match="scoring by log-likelihood needs"):
        CachedModel(Counting(), cache).loglikelihood([("p", "a")])


def test_replies_are_committed_while_the_run_goes_on(cache, tmp_path):
    """The writer thread commits each reply within moments, not at the end: another connection sees the
    first replies while the backend is still answering (what makes a SIGKILLed run resumable)."""
    import time

    seen_during_run: list[int] = []

    class Watching(Counting):
        def chat(self, conversations, params, on_result=None):  # type: ignore[override]
            def report(index: int, reply: str) -> None:
                on_result(index, reply)
                if index == 5:
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline:
                        with sqlite3.connect(cache.path) as other:
                            count = other.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
                        if count == 6:
                            break
                        time.sleep(0.01)
                    seen_during_run.append(count)

            return super().chat(conversations, params, report)

    CachedModel(Watching(), cache).chat([user_turn(f"q{i}") for i in range(10)], PARAMS)
    assert seen_during_run == [6] and len(cache) == 10


def test_a_failing_cache_write_is_raised_when_the_run_ends(tmp_path):
    broken = ResponseCache(tmp_path / "broken.sqlite")
    broken._db.execute("DROP TABLE responses")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        CachedModel(Counting(), broken).chat([user_turn("q")], PARAMS)
    broken.close()
