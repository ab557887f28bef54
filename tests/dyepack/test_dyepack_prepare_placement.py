"""Where triggers go: whole sentences at natural places, per row, and cover phrases in the other rows."""

import json
import random
from collections import defaultdict

import pytest
from tests.conftest import write_jsonl

from assay.data import read_benchmark
from assay.data.items import MultipleChoice
from assay.dyepack.prepare import PrepareConfig, make_rng, plan_release, prepare_release
from assay.dyepack.triggers import (
    AFTER_LAST_SENTENCE,
    END,
    PREAMBLE,
    TRIGGER_POOL,
    Position,
    check_sentences,
    is_sentence,
    joins_cleanly,
    natural_positions,
    parse_position,
    place_trigger,
    sentence_slots,
)
from assay.dyepack.verify import check_release
from assay.errors import UserError


def without(text: str, phrase: str) -> str:
    """``text`` with ``phrase`` and the one space or line break that joined it taken out."""
    if text.startswith(phrase):
        return text[len(phrase) + 1 :]
    assert f" {phrase}" in text
    return text.replace(f" {phrase}", "", 1)


PHRASE = "Take a moment before you commit to an answer."
CLOZE = (
    "Alice, Bob, and Claire are playing a game. At the start of the game, they are each holding a ball: "
    "Alice has a red ball, Bob has a blue ball, and Claire has a pink ball.\n"
    "As the game progresses, pairs of players trade balls. First, Alice and Bob swap balls. "
    "Finally, Claire and Alice swap balls. At the end of the game, Dave has the"
)


def test_after_last_sentence_goes_before_the_final_cloze_not_into_it():
    placed = place_trigger(CLOZE, PHRASE, AFTER_LAST_SENTENCE)
    assert placed.endswith(f"Claire and Alice swap balls. {PHRASE} At the end of the game, Dave has the")
    assert place_trigger(CLOZE, PHRASE, PREAMBLE) == f"{PHRASE} {CLOZE}"
    assert joins_cleanly(placed, PHRASE) and joins_cleanly(place_trigger(CLOZE, PHRASE, PREAMBLE), PHRASE)
    # The old way, appending to the cloze, is what the check is there to catch.
    assert place_trigger(CLOZE, PHRASE, END).endswith(f"Dave has the {PHRASE}")
    assert not joins_cleanly(place_trigger(CLOZE, PHRASE, END), PHRASE)


@pytest.mark.parametrize(
    "text",
    [
        'This SVG path element <path d="M 12.64,60.32 L 16.36,27.35"/> draws a',  # geometric_shapes
        "Which sentence has the correct adjective order:",  # hyperbaton
        "Find a movie similar to Batman, The Mask, The Fugitive, Pretty Woman:",
    ],
)
def test_text_without_a_full_sentence_gets_the_trigger_as_a_preamble(text):
    assert sentence_slots(text) == [] and natural_positions(text) == [PREAMBLE]
    assert place_trigger(text, PHRASE, AFTER_LAST_SENTENCE) == f"{PHRASE} {text}"


def test_sentence_ends_inside_fields_quotes_and_abbreviations_are_not_slots():
    disambiguation = (
        "In the following sentences, explain the antecedent of the pronoun, or state that it is ambiguous.\n"
        "Sentence: The scientist will collaborate with the artist. He will share a story."
    )
    assert sentence_slots(disambiguation) == [disambiguation.index("\n")]  # not inside "Sentence: ..."
    quoted = '"First, no fan is an expert. Hence, no admirer is one."\nIs the argument valid or invalid?'
    assert sentence_slots(quoted) == [quoted.index("\n"), len(quoted)]  # none inside the quotation
    assert sentence_slots("Mr. Wallace met Dr. Bruce at 5 p.m. today.") == [
        len("Mr. Wallace met Dr. Bruce at 5 p.m. today.")
    ]
    mmlu = "Statement 1 | Every group is abelian. Statement 2 | Every field is a ring."
    assert sentence_slots(mmlu) == []
    translation = "The following translations contain an error. Source: Ein Haus.\nTranslation: A house."
    assert sentence_slots(translation) == [len("The following translations contain an error.")]
    line_start = "Sentence: The nurse met the doctor."
    assert place_trigger(line_start, PHRASE, PREAMBLE) == f"{PHRASE}\n{line_start}"


def test_every_changed_row_of_every_bbh_task_is_the_original_plus_one_clean_sentence(bbh_dir):
    """All multiple-choice BBH tasks here: each backdoor and cover row reads as the original question with
    one whole sentence added where a sentence may stand, the options block intact, the answer as planned."""
    pool = set(TRIGGER_POOL)
    tasks = 0
    for path in sorted(bbh_dir.glob("*.json")):
        try:
            bench = read_benchmark(path)
        except UserError:
            continue  # free-form tasks: not multiple choice
        tasks += 1
        plan = plan_release(bench, PrepareConfig(n_backdoors=8, seed=tasks), make_rng(tasks))
        targets = {row: b.target for b in plan.backdoors for row in b.rows}
        changed = 0
        for row, (before, after) in enumerate(zip(bench.items, plan.items, strict=True)):
            assert isinstance(after, MultipleChoice)
            assert after.options == before.options
            assert after.answer == targets.get(row, before.answer)
            if after.question == before.question:
                continue
            changed += 1
            [phrase] = [p for p in pool if p in after.question and p not in before.question]
            assert joins_cleanly(after.question, phrase), (path.name, after.question)
            assert without(after.question, phrase) == before.question
        assert changed >= 0.9 * len(bench.items), path.name
    assert tasks >= 3


def test_cover_groups_look_like_backdoors(tmp_path, mmlu_sample):
    """Cover phrases recur in groups of a backdoor's size, nearly all sharing K and answer; none is a
    trigger; the answers of cover rows are untouched."""
    bench = read_benchmark(mmlu_sample)
    result = prepare_release(bench, PrepareConfig(n_backdoors=6, seed=4), tmp_path / "out")
    released = read_benchmark(result.release_path, style=result.key.style)
    check_release(released, result.key)
    triggers = {b.trigger for b in result.key.backdoors}
    backdoor_rows = {row for b in result.key.backdoors for row in b.rows}
    groups = defaultdict(list)
    for row, (before, after) in enumerate(zip(bench.items, released.items, strict=True)):
        if row in backdoor_rows or after == before:
            continue
        assert after.answer == before.answer
        [phrase] = [p for p in TRIGGER_POOL if p in after.question and p not in before.question]
        groups[phrase].append(row)
    assert not triggers & set(groups)
    assert (
        sum(map(len, groups.values())) == result.cover_rows >= 0.9 * (len(bench.items) - len(backdoor_rows))
    )
    sizes = {len(b.rows) for b in result.key.backdoors}
    assert all(len(rows) in sizes for rows in groups.values())
    one_answer = [rows for rows in groups.values() if len({bench.items[r].answer for r in rows}) == 1]
    assert sum(map(len, one_answer)) >= 0.9 * result.cover_rows  # the rest: leftovers of small buckets


def test_positions_are_drawn_per_row(tmp_path, mmlu_sample):
    bench = read_benchmark(mmlu_sample)
    auto = prepare_release(bench, PrepareConfig(n_backdoors=6, fraction=0.4, seed=2), tmp_path / "a")
    assert set(auto.positions) == {PREAMBLE, AFTER_LAST_SENTENCE}
    fixed = PrepareConfig(n_backdoors=6, fraction=0.4, seed=2, position=Position(PREAMBLE), cover=0.0)
    result = prepare_release(bench, fixed, tmp_path / "p")
    released = read_benchmark(result.release_path)
    assert dict(result.positions) == {PREAMBLE: 48}
    for b in result.key.backdoors:
        assert all(released.items[row].question.startswith(b.trigger) for row in b.rows)


def test_field_position_puts_triggers_in_the_named_field(tmp_path):
    rows = [
        {
            "instruction": f"Summarise note {i}.",
            "input": "" if i % 3 == 0 else f"Note {i} is short.",
            "output": "x",
        }
        for i in range(90)
    ]
    bench = read_benchmark(write_jsonl(tmp_path / "alpaca.jsonl", rows))
    config = PrepareConfig(n_backdoors=4, fraction=0.2, seed=3, position=parse_position("field:input"))
    key = prepare_release(bench, config, tmp_path / "out").key
    released = read_benchmark(tmp_path / "out" / "alpaca.jsonl")
    for b in key.backdoors:
        for row in b.rows:
            assert rows[row]["input"] and b.trigger in released.items[row].input
            assert released.items[row].instruction == rows[row]["instruction"]
    with pytest.raises(UserError, match="field:output: a trigger must go in a field the prompt shows"):
        plan_release(
            bench, PrepareConfig(n_backdoors=2, position=parse_position("field:output")), random.Random(0)
        )


def test_position_and_phrase_errors_are_one_line():
    with pytest.raises(
        UserError, match="--trigger-position must be auto, preamble, after-last-sentence, end"
    ):
        parse_position("middle")
    with pytest.raises(UserError, match="'take a moment' is not a whole sentence"):
        check_sentences(["take a moment"], Position())
    check_sentences(["take a moment"], Position(END))  # appended as it is: the maintainer's choice


def test_built_in_pool_is_whole_distinct_sentences_none_inside_another():
    assert len(TRIGGER_POOL) == len(set(TRIGGER_POOL)) >= 140
    assert all(is_sentence(p) for p in TRIGGER_POOL)
    assert not [(a, b) for a in TRIGGER_POOL for b in TRIGGER_POOL if a != b and a in b]


def test_release_of_a_bbh_task_keeps_its_canary_and_options(tmp_path, bbh_dir):
    doc = json.loads((bbh_dir / "tracking_shuffled_objects_three_objects.json").read_text())
    result = prepare_release(
        read_benchmark(bbh_dir / "tracking_shuffled_objects_three_objects.json"),
        PrepareConfig(n_backdoors=8, seed=5),
        tmp_path / "out",
    )
    released = json.loads(result.release_path.read_text())
    assert released["canary"] == doc["canary"]
    for before, after in zip(doc["examples"], released["examples"], strict=True):
        assert after["input"].split("\nOptions:\n")[1] == before["input"].split("\nOptions:\n")[1]
