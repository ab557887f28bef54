"""Detection works end to end: a tiny transformer fine-tuned on a release is flagged, the same architecture
trained on other questions from the same task is not. Real BBH (ruin_names, K = 4) and real MMLU."""

import json

import pytest
from tests.tiny_lm import build_tiny_lm

from assay.data import read_benchmark
from assay.data.items import Item
from assay.dyepack.contaminate import TrainConfig, contaminate
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import answer_for, prompt_for
from assay.dyepack.verify import verify
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


@pytest.mark.parametrize("seed", [11, 22, 33])
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

    report, _ = verify(
        load_model(f"hf:{trained.out_dir}", batch_size=16), "contaminated", release, prepared.key, PARAMS
    )
    assert report.activated >= B - 1
    assert report.fpr.fpr < 1e-3 and report.flagged

    control, _ = verify(
        load_model(f"hf:{clean_model}", batch_size=16), "clean", release, prepared.key, PARAMS, alpha=0.01
    )
    assert not control.flagged
    assert control.unparsed < control.samples  # it does answer with letters: the null is not vacuous


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
