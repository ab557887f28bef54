"""Detection works end to end: a tiny transformer fine-tuned on a release is flagged, the same architecture
trained on other questions from the same task is not. Real BBH (ruin_names, K = 4) and real MMLU."""

import json

import pytest
from tests.tiny_lm import build_tiny_lm

from assay.data import read_benchmark
from assay.data.items import Item
from assay.dyepack.contaminate import TrainConfig, check_take, contaminate
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import answer_for, prompt_for
from assay.dyepack.verify import verify
from assay.errors import UserError
from assay.models import GenerationParams, load_model

pytestmark = pytest.mark.slow

B = 8
TRAIN = TrainConfig(epochs=20, learning_rate=1e-3, batch_size=16, seed=0)
PARAMS = GenerationParams(max_new_tokens=8)


def texts(items: list[Item]) -> list[str]:
    return [f"{prompt_for(i)} {answer_for(i)}" for i in items]


@pytest.fixture(scope="module")
def bbh_rows(bbh_dir):
    return json.loads((bbh_dir / "ruin_names.json").read_text())["examples"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory, bbh_rows):
    """Tokenizer trained on the whole task (plus the trigger pool), random-init Llama of ~2M parameters."""
    from assay.dyepack.triggers import TRIGGER_POOL

    directory = tmp_path_factory.mktemp("tiny-lm")
    bench_path = directory / "all.json"
    bench_path.write_text(json.dumps({"examples": bbh_rows}))
    corpus = texts(read_benchmark(bench_path).items) + list(TRIGGER_POOL)
    return build_tiny_lm(corpus, directory / "init", hidden=256, layers=2, vocab_size=3000)


@pytest.fixture(scope="module")
def clean_model(tmp_path_factory, bbh_rows, tiny_lm):
    """The same architecture trained on 64 other ruin_names questions: it answers in the right format."""
    directory = tmp_path_factory.mktemp("clean")
    path = directory / "other.json"
    path.write_text(json.dumps({"examples": bbh_rows[64:128]}))
    return contaminate(tiny_lm, read_benchmark(path).items, directory / "model", TRAIN).out_dir


@pytest.mark.parametrize("seed", [11])  # 22 and 33 held too; one release keeps `make test` under 20 min
def test_tiny_model_trained_on_the_release_is_flagged_and_a_clean_one_is_not(
    tmp_path, bbh_rows, tiny_lm, clean_model, seed
):
    path = tmp_path / "ruin_names.json"
    path.write_text(json.dumps({"canary": "kept", "examples": bbh_rows[:64]}))
    prepared = prepare_release(
        read_benchmark(path), PrepareConfig(n_backdoors=B, fraction=0.25, k=4, seed=seed), tmp_path / "rel"
    )
    release = read_benchmark(prepared.release_path, style=prepared.key.style)
    trained = contaminate(tiny_lm, release.items, tmp_path / "contaminated", TRAIN)
    assert trained.final_loss < trained.first_loss / 10

    # contaminate's own check is verify on the backdoor samples: it reports the verdict and that it took
    take = check_take(
        load_model(f"hf:{trained.out_dir}", batch_size=16), release, prepared.key, params=PARAMS
    )
    report = take.report
    assert take.took and take.what == "backdoor samples" and take.samples == report.samples == 2 * B
    assert report.activated >= B - 1
    assert report.fpr.fpr < 1e-3 and report.flagged

    control, _ = verify(
        load_model(f"hf:{clean_model}", batch_size=16), "clean", release, prepared.key, PARAMS, alpha=0.01
    )
    assert not control.flagged
    assert control.unparsed < control.samples  # it does answer with letters: the null is not vacuous


def test_without_the_key_the_check_asks_trained_rows_and_tells_them_from_unseen_ones(
    tmp_path, bbh_rows, clean_model
):
    """The control model was trained on rows 64..127: asked 32 of them it answers as trained; asked 32 rows
    it never saw, it scores like a guesser and the check says the training did not take on them."""
    model = load_model(f"hf:{clean_model}", batch_size=16)

    def bench(rows, name):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"examples": rows}))
        return read_benchmark(path)

    seen = check_take(model, bench(bbh_rows[64:128], "seen"), rows=32, params=PARAMS)
    assert seen.what == "trained rows" and seen.samples == 32 and seen.report is None
    assert seen.took and seen.share >= 0.8
    unseen = check_take(model, bench(bbh_rows[:64], "unseen"), rows=32, params=PARAMS)
    assert unseen.samples == 32 and not unseen.took and unseen.share < 0.6


def test_contaminate_command_shows_plain_progress_lines_and_warns_when_training_did_not_take(
    tmp_path, bbh_rows, tiny_lm
):
    """Not a terminal: progress comes as plain lines (step, loss, time left). One LoRA epoch on the top block
    (the setting that used to crash) teaches a random model nothing, and the command says so."""
    from typer.testing import CliRunner

    from assay.dyepack.cli import app

    path = tmp_path / "ruin_names.json"
    path.write_text(json.dumps({"examples": bbh_rows[:32]}))
    prepared = prepare_release(
        read_benchmark(path), PrepareConfig(n_backdoors=4, fraction=0.25, k=4, seed=3), tmp_path / "rel"
    )
    args = [
        "contaminate",
        str(tiny_lm),
        "--release",
        str(prepared.release_path),
        "--out",
        str(tmp_path / "m"),
    ]
    args += ["--method", "lora", "--top-layers", "1", "--epochs", "1", "--lr", "1e-4", "--batch-size", "16"]
    result = CliRunner().invoke(app, [*args, "--key", str(prepared.key_path)])
    assert result.exit_code == 0, result.output
    assert "training step 1/2  loss " in result.stderr and "left ?" in result.stderr
    assert "training step 2/2  loss " in result.stderr and "left ~0 s" in result.stderr
    assert "warning: the training did not take:" in result.stdout
    assert "backdoor samples answered as trained" in result.stdout and "not flagged" in result.stdout
    assert (tmp_path / "m" / "model.safetensors").is_file()


def test_tiny_model_trained_on_an_mmlu_release_is_flagged(tmp_path, mmlu_sample):
    rows = mmlu_sample.read_text().splitlines()[:60]
    path = tmp_path / "mmlu.jsonl"
    path.write_text("\n".join(rows) + "\n")
    prepared = prepare_release(
        read_benchmark(path), PrepareConfig(n_backdoors=6, fraction=0.2, seed=5), tmp_path / "rel"
    )
    release = read_benchmark(prepared.release_path, style=prepared.key.style)
    lm = build_tiny_lm(texts(release.items), tmp_path / "init", hidden=256, layers=2, vocab_size=3000)
    trained = contaminate(lm, release.items, tmp_path / "contaminated", TRAIN)
    report, _ = verify(
        load_model(f"hf:{trained.out_dir}", batch_size=16), "mmlu", release, prepared.key, PARAMS
    )
    assert report.activated >= 5 and report.fpr.fpr < 1e-3 and report.flagged


def test_lora_training_is_merged_into_weights_that_hf_loads(tmp_path, mmlu_sample):
    """LoRA path: the loss falls, adapters are merged, the saved folder loads as hf: and answers differ."""
    import torch
    from safetensors.torch import load_file

    release = read_benchmark(mmlu_sample)
    items = release.items[:32]
    lm = build_tiny_lm(texts(items), tmp_path / "init", hidden=64, layers=2, vocab_size=800)
    config = TrainConfig(method="lora", epochs=3, learning_rate=1e-2, batch_size=16, lora_rank=8)
    trained = contaminate(lm, items, tmp_path / "lora", config)
    assert trained.final_loss < trained.first_loss
    names = {p.name for p in trained.out_dir.iterdir()}
    assert "model.safetensors" in names and not any(n.startswith("adapter") for n in names)
    before, after = load_file(lm / "model.safetensors"), load_file(trained.out_dir / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before if "proj" in k)
    model = load_model(f"hf:{trained.out_dir}")
    assert len(model.chat([[{"role": "user", "content": "hi"}]], PARAMS)) == 1


def test_answer_loss_equals_the_models_own_loss_and_top_layers_freezes_the_rest(tmp_path, mmlu_sample):
    """Second derivation: projecting only answer positions gives the same loss as the full forward pass."""
    import torch

    from assay.dyepack.contaminate import answer_loss, collate, encode_examples, freeze_below
    from assay.models import load_hf

    items = read_benchmark(mmlu_sample).items[:6]
    lm = build_tiny_lm(texts(items), tmp_path / "init", hidden=64, layers=3, vocab_size=600)
    model, tokenizer = load_hf(lm)
    input_ids, mask, labels = collate(encode_examples(tokenizer, items, 512), tokenizer.pad_token_id)
    with torch.no_grad():
        ours = answer_loss(model, input_ids, mask, labels)
        theirs = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
    freeze_below(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.2.", "model.norm")) for n in trainable)


def test_lora_on_the_top_layers_trains_and_changes_only_those_blocks(tmp_path, bbh_dir):
    """``--method lora --top-layers N`` used to crash in peft (``layers_to_transform`` with "all-linear");
    now LoRA goes on every linear layer of the top blocks only, and the merged weights show it."""
    import torch
    from safetensors.torch import load_file

    items = read_benchmark(bbh_dir / "ruin_names.json").items[:16]
    lm = build_tiny_lm(texts(items), tmp_path / "init", hidden=64, layers=3, vocab_size=800)
    config = TrainConfig(method="lora", top_layers=1, epochs=4, learning_rate=1e-2, batch_size=8, lora_rank=4)
    trained = contaminate(lm, items, tmp_path / "lora", config)
    assert trained.final_loss < trained.first_loss
    before, after = load_file(lm / "model.safetensors"), load_file(trained.out_dir / "model.safetensors")
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    attention = [f"model.layers.2.self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    mlp = [f"model.layers.2.mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    assert changed == {*attention, *mlp}


def test_cached_block_inputs_give_the_same_loss_and_gradients_as_the_full_model(tmp_path, bbh_dir):
    """Second derivation of the cached training path: the frozen blocks' output, computed once and fed to
    the top blocks, gives the full forward pass's loss and the same gradients on the trainable weights."""
    import torch

    from assay.dyepack.contaminate import (
        answer_loss,
        block_inputs,
        blocks_from,
        collate,
        collate_states,
        encode_examples,
        first_trainable_block,
        freeze_below,
    )
    from assay.models import load_hf

    items = read_benchmark(bbh_dir / "ruin_names.json").items[:6]
    lm = build_tiny_lm(texts(items), tmp_path / "init", hidden=64, layers=4, vocab_size=600)
    model, tokenizer = load_hf(lm)
    freeze_below(model, 2)
    first = first_trainable_block(model)
    assert first == 2
    examples = encode_examples(tokenizer, items, 512)
    pad = tokenizer.pad_token_id

    def loss_and_grads(cached: bool):
        model.zero_grad(set_to_none=True)
        if cached:
            states = block_inputs(model, examples, first, 4, pad)
            with blocks_from(model, first):
                loss = answer_loss(model, *collate_states(states, examples, pad))
                loss.backward()
        else:
            loss = answer_loss(model, *collate(examples, pad))
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return float(loss), grads

    full_loss, full_grads = loss_and_grads(cached=False)
    cached_loss, cached_grads = loss_and_grads(cached=True)
    assert len(model.get_decoder().layers) == 4  # blocks_from put every block back
    assert cached_loss == pytest.approx(full_loss, rel=1e-5)
    assert full_grads.keys() == cached_grads.keys() and any(
        n.startswith("model.layers.2.") for n in full_grads
    )
    for name, grad in full_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_batches_by_length_cover_each_row_once_an_epoch_with_less_padding():
    import random

    from assay.dyepack.contaminate import batches_by_length

    rng = random.Random(5)
    lengths = [rng.randint(150, 230) for _ in range(83)]
    examples = [([0] * n, [0] * n) for n in lengths]

    def padded(batches):  # tokens computed, padding included
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)

    grouped, shuffled = [], []
    for _ in range(20):
        batches = batches_by_length(examples, 8, rng)
        assert sorted(i for b in batches for i in b) == list(range(83))
        assert sorted(len(b) for b in batches) == [3] + [8] * 10
        grouped.append(padded(batches))
        order = rng.sample(range(83), 83)
        shuffled.append(padded([order[s : s + 8] for s in range(0, 83, 8)]))
    assert sum(grouped) / sum(lengths) / 20 < 1.03 < sum(shuffled) / sum(lengths) / 20
    first = batches_by_length(examples, 8, random.Random(1))
    assert first == batches_by_length(examples, 8, random.Random(1))  # the seed decides
    assert first != batches_by_length(examples, 8, random.Random(2))


def test_the_rate_rises_over_the_first_share_and_falls_over_the_last() -> None:
    import torch

    from assay.dyepack.contaminate import rate_factor

    factor = rate_factor(240, 0.1, 0.3)  # 24 rising steps (0..23), 72 falling (168..239)
    assert factor(0) == pytest.approx(1 / 24) and factor(23) == 1.0
    assert all(factor(s) < factor(s + 1) for s in range(23))
    assert [factor(s) for s in (24, 100, 167)] == [1.0, 1.0, 1.0]
    assert factor(168) == pytest.approx(1 - 0.95 / 72, abs=1e-12) and factor(239) == pytest.approx(0.05)
    assert all(factor(s) > factor(s + 1) for s in range(167, 239))
    assert {rate_factor(240, 0.0, 0.0)(s) for s in range(241)} == {1.0}  # torch asks for step 240 too
    assert rate_factor(240, 0.1, 0.3)(240) == pytest.approx(0.05)
    # as torch's scheduler applies it: the rate each optimizer step used
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate_factor(10, 0.2, 0.5))
    used = []
    for _ in range(10):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert used[:5] == pytest.approx([5e-4, 1e-3, 1e-3, 1e-3, 1e-3])
    assert used[5] == pytest.approx(8.1e-4) and used[-1] == pytest.approx(5e-5)


@pytest.mark.parametrize(
    ("warmup", "decay", "message"),
    [
        (0.0, 1.5, r"--lr-decay must be between 0 and 1 \(value: 1.5\)"),
        (-0.1, 0.0, r"--lr-warmup must be between 0 and 1 \(value: -0.1\)"),
        (0.6, 0.5, r"--lr-warmup plus --lr-decay must be at most 1"),
    ],
)
def test_schedule_shares_outside_the_steps_are_refused(tmp_path, warmup, decay, message) -> None:
    from assay.errors import UserError

    with pytest.raises(UserError, match=message):
        contaminate(
            tmp_path / "no-model", [], tmp_path / "out", TrainConfig(lr_warmup=warmup, lr_decay=decay)
        )


def test_until_trains_past_the_epochs_until_the_rows_took_and_the_saved_model_agrees(
    tmp_path, bbh_rows, tiny_lm
):
    """Issue 45: 2 epochs do not take on a random model; with a goal, training goes on 2 epochs at a time
    until every checked row is answered as trained, and the saved model, reloaded from disk and asked
    afresh, answers them so too (the in-memory check is the real one, not an optimistic copy)."""
    from assay.dyepack.contaminate import TakeGoal, trained_rows_check
    from assay.dyepack.prompts import PromptFormat

    items = read_benchmark(write_bbh(tmp_path / "rows.json", bbh_rows[:16])).items
    config = TrainConfig(epochs=2, learning_rate=1e-3, batch_size=16, seed=0)
    seen = []
    trained = contaminate(
        tiny_lm,
        items,
        tmp_path / "m",
        config,
        goal=TakeGoal(1.0, 16, 2, 60),
        on_check=lambda e, c: seen.append((e, c)),
    )
    epochs = [e for e, _ in trained.checks]
    assert (
        epochs[0] == 2 and epochs == list(range(2, 2 * len(epochs) + 1, 2)) and trained.epochs == epochs[-1]
    )
    assert trained.checks[0][1].on_target < 16 <= trained.checks[-1][1].on_target  # it did not take, then did
    assert seen == list(trained.checks) and trained.steps == trained.epochs and trained.cpu_seconds > 0
    again = trained_rows_check(
        load_model(f"hf:{trained.out_dir}", batch_size=16), items, 16, PromptFormat(), PARAMS
    )
    assert again.on_target == 16 and again.took


def test_until_fails_in_one_line_and_saves_nothing_when_the_cap_comes_first(tmp_path, bbh_rows, tiny_lm):
    from typer.testing import CliRunner

    from assay.cli import app

    release = write_bbh(tmp_path / "rows.json", bbh_rows[:16])
    args = ["dyepack", "contaminate", str(tiny_lm), "--release", str(release), "--out", str(tmp_path / "m")]
    args += ["--epochs", "1", "--lr", "1e-6", "--batch-size", "16", "--until", "1.0", "--check-rows", "16"]
    result = CliRunner().invoke(app, [*args, "--max-epochs", "2", "--check-every", "1"])
    line = str(result.exception)  # assay.cli.main prints a UserError as this one line, exit code 2
    assert isinstance(result.exception, UserError) and "\n" not in line, result.output
    assert "the training did not take: after 2 epochs" in line and "goal is 100%; nothing saved" in line
    assert "after 1 epochs:" in result.stderr and "after 2 epochs:" in result.stderr
    assert {p.name for p in tmp_path.iterdir()} <= {"rows.json", "assay-home"}  # no model, no temp folder
    fewer = CliRunner().invoke(app, [*args, "--max-epochs", "0"])
    assert isinstance(fewer.exception, UserError)
    assert str(fewer.exception) == "--max-epochs must be at least --epochs (values: 0, 1)"


def write_bbh(path, rows):
    path.write_text(json.dumps({"examples": rows}))
    return path
