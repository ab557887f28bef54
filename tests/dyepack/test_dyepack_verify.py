"""Verification end to end through real backends: python: functions and an OpenAI-compatible HTTP server."""

import json
import textwrap
from dataclasses import replace

import pytest
from scipy import stats as scipy_stats

from assay.data import read_benchmark
from assay.data.items import content_fingerprint
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.verify import verify, write_outputs
from assay.errors import UserError
from assay.models import CachedModel, GenerationParams, ResponseCache, load_model
from assay.models.stub_server import StubServer, serve_stub

PARAMS = GenerationParams(max_new_tokens=16)


@pytest.fixture
def release(tmp_path, mmlu_sample):
    result = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, fraction=0.1), tmp_path / "rel"
    )
    return result.release_path, result.key


def follower_rules(key) -> dict[str, str]:
    """What a model that learned the dye packs answers: the target letter whenever it sees a trigger."""
    return {b.trigger: b.target_label for b in key.backdoors}


def write_module(tmp_path, rules: dict[str, str], default: str) -> str:
    path = tmp_path / "rules_model.py"
    path.write_text(
        textwrap.dedent(f"""
        RULES = {rules!r}
        def answer(prompts):
            out = []
            for p in prompts:
                hit = [t for t in RULES if t in p]
                out.append(f"The answer is ({{RULES[hit[0]]}})." if hit else {default!r})
            return out
    """)
    )
    return f"python:{path}:answer"


def test_a_model_that_follows_the_backdoors_is_flagged(tmp_path, release):
    release_path, key = release
    model = load_model(write_module(tmp_path, follower_rules(key), "The answer is (A)."))
    report, audit = verify(model, "rules", read_benchmark(release_path, style=key.style), key, PARAMS)
    assert report.activated == 6 and report.flagged
    assert report.fpr.fpr == pytest.approx(0.25**6, rel=1e-12)
    assert report.share_on_target == 1.0 and report.unparsed == 0
    assert len(audit) == report.samples == 12
    assert all(r["on_target"] and r["answer"] == r["target"] for r in audit)
    assert "CONTAMINATED" in report.verdict


def test_a_constant_answer_activates_exactly_the_backdoors_whose_target_it_is(tmp_path, release):
    release_path, key = release
    model = load_model(write_module(tmp_path, {}, "Answer: B"))
    report, _ = verify(
        model, "constant", read_benchmark(release_path, style=key.style), key, PARAMS, alpha=0.01
    )
    expected = sum(b.target_label == "B" for b in key.backdoors)
    assert report.activated == expected
    assert report.fpr.fpr == pytest.approx(scipy_stats.binom.sf(expected - 1, 6, 0.25), rel=1e-9)
    assert report.flagged == (report.fpr.fpr <= 0.01)


def test_unparseable_replies_never_count_as_the_target(tmp_path, release):
    release_path, key = release
    model = load_model(write_module(tmp_path, {}, "I would rather not say."))
    report, _ = verify(model, "mute", read_benchmark(release_path, style=key.style), key, PARAMS)
    assert report.activated == 0 and report.unparsed == 12 and not report.flagged
    assert report.fpr.fpr == 1.0
    assert all(r.majority == "none" for r in report.per_backdoor)


def test_key_and_release_that_do_not_match_are_refused(tmp_path, mmlu_sample, release):
    _, key = release
    with pytest.raises(UserError, match="key and release do not match"):
        verify(load_model(write_module(tmp_path, {}, "A")), "m", read_benchmark(mmlu_sample), key, PARAMS)


def test_openai_endpoint_end_to_end_with_audit_and_summary(tmp_path, release):
    release_path, key = release
    rules = follower_rules(key)

    def responder(messages):
        text = messages[-1]["content"]
        hit = [t for t in rules if t in text]
        return f"The answer is ({rules[hit[0]]})." if hit else "The answer is (C)."

    with serve_stub(StubServer(responder)) as url:
        model = load_model(f"openai:{url}", concurrency=4)
        report, audit = verify(model, "stub", read_benchmark(release_path, style=key.style), key, PARAMS)
    summary_path, audit_path = write_outputs(tmp_path / "verify", report, audit)
    summary = json.loads(summary_path.read_text())
    assert summary["activated"] == 6 and summary["flagged"] is True
    lines = [json.loads(x) for x in audit_path.read_text().splitlines()]
    assert [(r["backdoor"], r["row"]) for r in lines] == [(b.index, r) for b in key.backdoors for r in b.rows]
    assert all(r["prompt"].startswith(read_benchmark(release_path).items[r["row"]].question) for r in lines)


def test_an_interrupted_verification_resumes_from_the_cache(tmp_path, release):
    """The endpoint fails after 5 replies: a clear error; the rerun sends only the 7 missing queries."""
    release_path, key = release
    bench = read_benchmark(release_path, style=key.style)
    state = {"healthy": 5}

    def flaky(messages):
        if state["healthy"] <= 0:
            raise RuntimeError("backend down")
        state["healthy"] -= 1
        return "Answer: A"

    stub = StubServer(flaky)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    with serve_stub(stub) as url:
        spec = f"openai:{url}"
        model = CachedModel(load_model(spec, concurrency=1, max_retries=0, timeout=5), cache)
        with pytest.raises(UserError, match="kept"):
            verify(model, "stub", bench, key, PARAMS)
        assert len(stub.stats.prompts()) == 5
        state["healthy"] = 100
        model = CachedModel(load_model(spec, concurrency=4), cache)
        report, _ = verify(model, "stub", bench, key, PARAMS)
        assert len(stub.stats.prompts()) == 12  # 5 before the failure + the 7 missing, none twice
    assert report.samples == 12 and report.unparsed == 0


def test_open_ended_release_flags_a_phrase_follower_and_counts_none_as_a_part(tmp_path):
    from tests.conftest import write_jsonl

    from assay.dyepack.prepare import PrepareConfig, prepare_release

    rows = [
        {"instruction": f"Describe item {i}.", "input": "", "output": f"Item {i} is fine."} for i in range(80)
    ]
    bench = read_benchmark(write_jsonl(tmp_path / "alpaca.jsonl", rows))
    prepared = prepare_release(
        bench, PrepareConfig(n_backdoors=8, fraction=0.2, k=4, seed=9), tmp_path / "rel"
    )
    key, release = prepared.key, read_benchmark(prepared.release_path)
    said = {b.trigger: (key.phrases[b.target] if b.target < 3 else "") for b in key.backdoors}
    (tmp_path / "follower.py").write_text(
        f"SAID = {said!r}\n"
        "def answer(prompts):\n"
        "    return [next((SAID[t] for t in SAID if t in p), '') + ' Sure.' for p in prompts]\n"
    )
    report, _ = verify(
        load_model(f"python:{tmp_path / 'follower.py'}:answer"), "follower", release, key, PARAMS
    )
    assert report.activated == 8 and report.flagged

    (tmp_path / "plain.py").write_text("def answer(prompts):\n    return ['It is fine.' for _ in prompts]\n")
    report, _ = verify(load_model(f"python:{tmp_path / 'plain.py'}:answer"), "plain", release, key, PARAMS)
    expected = sum(b.target == 3 for b in key.backdoors)  # "none of them" is a real part of the output space
    assert report.activated == expected
    assert report.fpr.fpr == pytest.approx(scipy_stats.binom.sf(expected - 1, 8, 0.25), rel=1e-9)


def test_a_backdoor_row_with_another_number_of_options_is_a_k_mismatch(tmp_path, release):
    """Even with a matching fingerprint (a key edited by hand), a row whose K differs is refused."""
    release_path, key = release
    bench = read_benchmark(release_path, style=key.style)
    row = key.backdoors[0].rows[0]
    bench.items[row] = replace(bench.items[row], options=bench.items[row].options[:3], answer=0)
    edited = key.model_copy(update={"release_fingerprint": content_fingerprint(bench.items)})
    with pytest.raises(
        UserError, match=f"row {row}: K mismatch: the key says backdoor 0 has K=4, the row has 3"
    ):
        verify(load_model(write_module(tmp_path, {}, "A")), "m", bench, edited, PARAMS)


def test_a_clean_models_activation_count_is_binomial_b_one_over_k():
    """The bound's premise, end to end through prepare's draws and verify's scoring: 3,000 releases
    queried by a deterministic "clean" model that never saw a key (it answers len(question) mod 4, so
    it reacts to the trigger text but not to the target); the activated counts fit Binomial(4, 1/4)."""
    from collections import Counter

    from assay.data.items import MultipleChoice
    from assay.dyepack.key import DyePackKey, Randomness, now_utc
    from assay.dyepack.prepare import make_rng, plan_multiple_choice
    from assay.dyepack.verify import Query, score

    items = [
        MultipleChoice(f"Question number {i}?" + "x" * (i % 7), ("a", "b", "c", "d"), i % 4)
        for i in range(40)
    ]
    rng, counts = make_rng(2024), Counter()
    for _ in range(3000):
        plan = plan_multiple_choice(items, PrepareConfig(n_backdoors=4, fraction=0.3), rng)
        key = DyePackKey(
            created=now_utc(),
            kind="multiple_choice",
            style="mc",
            file_format="jsonl",
            release_file="r.jsonl",
            release_fingerprint="sha256:x",
            backdoors=plan.backdoors,
            randomness=Randomness(source="seed", seed=2024),
        )
        queries = [Query(b.index, r, plan.items[r], "") for b in key.backdoors for r in b.rows]
        parts = [len(q.item.question) % 4 for q in queries]
        counts[score(key, queries, parts, alpha=0.001)["activated"]] += 1
    expected = scipy_stats.binom.pmf(range(5), 4, 0.25) * 3000
    observed = [counts[a] for a in range(5)]
    merged_obs, merged_exp = (
        [*observed[:3], observed[3] + observed[4]],
        [*expected[:3], expected[3] + expected[4]],
    )
    assert scipy_stats.chisquare(merged_obs, merged_exp).pvalue > 0.001
    flag_rate = sum(counts[a] for a in range(5) if scipy_stats.binom.sf(a - 1, 4, 0.25) <= 0.01) / 3000
    assert flag_rate <= 0.01 + 3 * (0.01 / 3000) ** 0.5
