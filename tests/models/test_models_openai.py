"""openai backend against the real stub server on 127.0.0.1: order, retries, errors, model discovery."""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import pytest

from assay.errors import UserError
from assay.models import GenerationParams, load_model, stream_chat, user_turn
from assay.models.stub_server import StubServer, serve_stub

PARAMS = GenerationParams(max_new_tokens=16)


def _closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_replies_come_back_in_input_order_under_concurrency():
    stub = StubServer(latency=0.02)
    prompts = [f"question {i}" for i in range(40)]
    arrived: list[int] = []
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", concurrency=8)
        replies = model.chat(
            [user_turn(p) for p in prompts], PARAMS, on_result=lambda i, text: arrived.append(i)
        )
    assert replies == [f"echo: {p}" for p in prompts]
    assert sorted(arrived) == list(range(40))
    assert stub.stats.chat_requests == 40
    body = stub.stats.chat_bodies[0]
    assert body["model"] == "stub-model"
    assert body["max_tokens"] == 16 and body["temperature"] == 0.0 and body["top_p"] == 1.0
    assert "seed" not in body


def test_multi_turn_messages_and_seed_are_sent_as_given():
    seen: list[list[dict]] = []
    stub = StubServer(lambda messages: seen.append(messages) or "ok")
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}")
        assert model.chat([conversation], GenerationParams(seed=3, temperature=0.7)) == ["ok"]
    assert seen == [conversation]
    assert stub.stats.chat_bodies[0]["seed"] == 3


def test_model_is_discovered_from_models_endpoint():
    stub = StubServer(models=["only-one"])
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}")
        assert model.model_id == f"openai:{url}#only-one"
        assert model.chat([user_turn("x")], PARAMS) == ["echo: x"]
    assert stub.stats.model_requests == 1


def test_several_served_models_need_a_name():
    with serve_stub(StubServer(models=["a", "b"])) as url:
        with pytest.raises(UserError, match=r"serves 2 models \(a, b\)"):
            _ = load_model(f"openai:{url}").model_id
        assert load_model(f"openai:{url}", model_name="b").chat([user_turn("y")], PARAMS) == ["echo: y"]


def test_429_twice_then_success_is_retried():
    stub = StubServer(fail_first=2, fail_status=429)
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", max_retries=3)
        started = time.monotonic()
        assert model.chat([user_turn("hello")], PARAMS) == ["echo: hello"]
        waited = time.monotonic() - started
    assert stub.stats.status_counts == {429: 2, 200: 1}
    assert waited >= 0.3  # the client's own backoff: ~0.5 s then ~1 s, less jitter


def test_500_then_success_honours_retry_after():
    stub = StubServer(fail_first=1, fail_status=500, retry_after=0.01)
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", max_retries=2)
        assert model.chat([user_turn("a"), user_turn("b")], PARAMS) == ["echo: a", "echo: b"]
    assert stub.stats.status_counts == {500: 1, 200: 2}


def test_exhausted_retries_give_one_line_error_keeping_results():
    stub = StubServer(
        lambda messages: "fine" if messages[-1]["content"] != "bad" else 1 / 0,  # type: ignore[return-value]
        retry_after=0.01,
    )
    got: dict[int, str] = {}
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", max_retries=1, concurrency=1)
        conversations = [user_turn("a"), user_turn("b"), user_turn("bad"), user_turn("c")]
        with pytest.raises(UserError) as caught:
            model.chat(conversations, PARAMS, on_result=got.__setitem__)
    message = str(caught.value)
    assert "\n" not in message
    assert url in message and "HTTP 500" in message and "after 1 retry:" in message
    assert "2 of 4 responses had arrived and were kept" in message
    assert got == {0: "fine", 1: "fine"}


def test_unreachable_endpoint_fails_fast_in_one_line():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    model = load_model(f"openai:{url}", model_name="m", max_retries=1, timeout=2.0)
    started = time.monotonic()
    with pytest.raises(UserError) as caught:
        model.chat([user_turn("x")], PARAMS)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message and url in message and "0 of 1 responses" in message
    assert "connection failed" in message
    # discovery fails the same way
    with pytest.raises(UserError, match=r"listing /models failed"):
        _ = load_model(f"openai:{url}", max_retries=0).model_id


def test_request_timeout_is_a_user_error():
    stub = StubServer(latency=1.0)
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", max_retries=0, timeout=0.3)
        with pytest.raises(UserError, match="timed out"):
            model.chat([user_turn("slow")], PARAMS)


def test_chat_works_from_a_worker_thread_and_inside_a_running_loop():
    import asyncio

    with serve_stub() as url:
        model = load_model(f"openai:{url}", model_name="stub-model")
        out: list[list[str]] = []
        thread = threading.Thread(target=lambda: out.append(model.chat([user_turn("t")], PARAMS)))
        thread.start()
        thread.join()
        assert out == [["echo: t"]]

        async def caller() -> list[str]:
            sync_result = model.chat([user_turn("sync")], PARAMS)  # nested loop -> helper thread
            return sync_result + await model.achat([user_turn("async")], PARAMS)

        assert asyncio.run(caller()) == ["echo: sync", "echo: async"]


def test_stub_truncates_to_max_tokens_and_reports_unknown_model():
    with serve_stub(StubServer(lambda m: "one two three four")) as url:
        model = load_model(f"openai:{url}", model_name="stub-model")
        assert model.chat([user_turn("x")], GenerationParams(max_new_tokens=2)) == ["one two"]
        wrong = load_model(f"openai:{url}", model_name="nope", max_retries=0)
        with pytest.raises(UserError, match="HTTP 404"):
            wrong.chat([user_turn("x")], PARAMS)


def test_stream_yields_the_reply_in_pieces_and_other_backends_fall_back_to_chat(tmp_path):
    stub = StubServer(lambda messages: "one two three four", chunk_delay=0.01)
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}")
        pieces = list(stream_chat(model, user_turn("count"), PARAMS))
        assert model.chat([user_turn("count")], PARAMS) == ["one two three four"]  # non-streaming unchanged
    assert pieces == ["one ", "two ", "three ", "four"]
    assert stub.stats.chat_bodies[0]["stream"] is True and "stream" not in stub.stats.chat_bodies[1]
    module = tmp_path / "whole.py"
    module.write_text("def reply(prompts):\n    return ['all at once' for _ in prompts]\n")
    assert list(stream_chat(load_model(f"python:{module}:reply"), user_turn("x"), PARAMS)) == ["all at once"]
    failing = StubServer(fail_first=9, fail_status=500, retry_after=0.001)
    with serve_stub(failing) as url, pytest.raises(UserError, match=r"streamed chat completion failed.*500"):
        list(stream_chat(load_model(f"openai:{url}", max_retries=1), user_turn("x"), PARAMS))


def test_a_failing_models_listing_is_retried_once_and_suggests_model_name():
    """``transformers serve`` answers 500 on /models: one line naming --model-name after one retry, not
    five; with the name given, /models is never asked."""
    stub = StubServer(models_status=500)
    with serve_stub(stub) as url:
        with pytest.raises(UserError) as caught:
            load_model(f"openai:{url}", max_retries=5).chat([user_turn("x")], PARAMS)
        assert stub.stats.model_requests == 2 and stub.stats.chat_requests == 0
        named = load_model(f"openai:{url}", model_name="stub-model", max_retries=5)
        assert named.chat([user_turn("x")], PARAMS) == ["echo: x"]
    assert stub.stats.model_requests == 2
    message = str(caught.value)
    assert "\n" not in message and "HTTP 500" in message and "--model-name" in message


def _word_scorer(prompt: str) -> list[tuple[str, float]]:
    """Tokens are the prompt's words with their leading space; each word's log-probability is -len(word)."""
    import re

    return [(token, -float(len(token.strip()))) for token in re.findall(r"\s*\S+", prompt)]


def test_completions_and_echoed_loglikelihoods():
    """Plain continuations through /completions; a score is the sum of the echoed prompt's token
    log-probabilities over the continuation's characters (here: minus its letters, an oracle by hand)."""
    stub = StubServer(lambda messages: f"cont of {messages[0]['content']}", scorer=_word_scorer)
    with serve_stub(stub) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", concurrency=2)
        assert model.complete(["Q: 2+2\nA:", "x"], PARAMS) == ["cont of Q: 2+2\nA:", "cont of x"]
        requests = [("Q: capital of France?\nA:", " Paris"), ("Q: capital of France?\nA:", " Lyon is it")]
        assert model.loglikelihood(requests) == [-5.0, -8.0]
    body = stub.stats.completion_bodies[-1]
    assert body["echo"] is True and body["logprobs"] == 1 and body["max_tokens"] == 1
    assert body["prompt"] in ("Q: capital of France?\nA: Paris", "Q: capital of France?\nA: Lyon is it")
    assert stub.stats.chat_requests == 0


def test_a_server_without_prompt_logprobs_or_completions_is_named_in_one_line():
    with serve_stub(StubServer()) as url:  # no scorer: echo+logprobs ignored, as transformers serve does
        model = load_model(f"openai:{url}", model_name="stub-model")
        with pytest.raises(UserError, match=r"does not return the prompt's log-probabilities.*--mode"):
            model.loglikelihood([("a", " b")])
    with serve_stub(StubServer(completions=False)) as url:
        model = load_model(f"openai:{url}", model_name="stub-model", max_retries=0)
        with pytest.raises(UserError, match=r"HTTP 404.*no /completions API: ask it in chat mode"):
            model.complete(["x"], PARAMS)


def test_batch_retry_rules_follow_the_sdk():
    """The bare-aiohttp batch path keeps the SDK's rules: the server's wait within (0, 120] s, an HTTP
    date, a longer wait not retried, ``x-should-retry`` over the status, else capped backoff with jitter."""
    from assay.models import http_batch

    assert http_batch.retry_delay(0, {"retry-after-ms": "250"}) == 0.25
    assert http_batch.retry_delay(0, {"retry-after": "3"}) == 3.0
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8.0 < http_batch.retry_delay(0, {"retry-after": in_ten}) <= 10.0
    for attempt, ceiling in ((0, 0.5), (1, 1.0), (4, 8.0), (9, 8.0)):
        delay = http_batch.retry_delay(attempt, {"retry-after": "500"})  # too long to honour: backoff
        assert 0.75 * ceiling <= delay <= ceiling
    assert not http_batch._should_retry(429, {"retry-after": "500"})
    assert not http_batch._should_retry(503, {"x-should-retry": "false"})
    assert http_batch._should_retry(400, {"x-should-retry": "true"})
    assert [http_batch._should_retry(s, {}) for s in (400, 404, 408, 409, 429, 500, 503)] == [
        False,
        False,
        True,
        True,
        True,
        True,
        True,
    ]
    assert http_batch.error_message(b'{"error": {"message": "slow down"}}') == "slow down"
    assert http_batch.error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert http_batch.error_message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
