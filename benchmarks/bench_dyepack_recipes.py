"""Screen `contaminate` recipes on a BIG-Bench Hard release: by epoch, how many backdoor samples it took.

Long items (logical_deduction_five_objects, ~200 tokens a row) sit on a plateau where the model gives
every row the same letter for a number of epochs that depends on the release, then memorise in a burst
(docs/dyepack.md, "A recipe for long items"). Whether a recipe is short enough for the CPU budget is
decided by the worst releases, so this script trains each recipe on the same releases and prints, after
every epoch, the teacher-forced answers: backdoor samples whose whole answer the model predicts as trained
(of 24), all rows (of 80), and the CPU seconds spent (block cache and training; the evaluation is not
counted). Greedy generation gives exactly these answers when every token is predicted, so "24/24" means
the check of ``contaminate`` would find every sample on target.

    python benchmarks/bench_dyepack_recipes.py --seeds 3 4 --epochs 14 \
        --recipe lr=1e-3 --recipe lr=5e-4,warmup=0.1,decay=0.3

A recipe is ``key=value`` pairs: lr, batch, top (blocks trained), warmup and decay (shares of the steps,
``contaminate --lr-warmup/--lr-decay``). ``--seeds`` fixes the release's targets (the same release for
every recipe); the training order is seeded alike, so two recipes differ only in what they name.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dyepack_bbh import BBH, write_rows
from bench_dyepack_demo import machine

DEFAULTS = {"lr": 1e-3, "batch": 8, "top": 4, "warmup": 0.0, "decay": 0.0}


def parse_recipe(text: str) -> dict[str, float]:
    recipe = dict(DEFAULTS)
    for pair in filter(None, text.split(",")):
        name, _, value = pair.partition("=")
        if name not in DEFAULTS:
            raise SystemExit(f"--recipe {text}: unknown key {name!r} (keys: {', '.join(DEFAULTS)})")
        recipe[name] = float(value)
    return recipe


def release_for(seed: int, out: Path, task: str):
    from assay.data import read_benchmark
    from assay.dyepack.prepare import PrepareConfig, prepare_release

    folder = out / f"release-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    source = write_rows(BBH / f"{task}.json", 80, folder)
    config = PrepareConfig(n_backdoors=8, fraction=0.3, seed=seed)
    prepared = prepare_release(read_benchmark(source), config, folder / "release")
    release = read_benchmark(prepared.release_path, style=prepared.key.style)
    return release, {row for backdoor in prepared.key.backdoors for row in backdoor.rows}


def answered_as_trained(model, states, examples, pad: int, rows: range) -> list[bool]:
    """Per row: does the model predict every answer token as trained (teacher forcing)?"""
    import torch

    from assay.dyepack.contaminate import collate_states

    model.eval()
    right = []
    with torch.no_grad():
        for start in range(rows.start, rows.stop, 8):
            chosen = list(range(start, min(rows.stop, start + 8)))
            hidden, mask, labels = collate_states(
                [states[i] for i in chosen], [examples[i] for i in chosen], pad
            )
            out = model.get_decoder()(inputs_embeds=hidden, attention_mask=mask, use_cache=False)
            targets = labels[:, 1:]
            for row in range(len(chosen)):
                keep = targets[row] != -100
                guess = model.get_output_embeddings()(out.last_hidden_state[row, :-1][keep]).argmax(-1)
                right.append(bool((guess == targets[row][keep]).all()))
    model.train()
    return right


def train(recipe: dict[str, float], release, backdoor_rows: set[int], epochs: int, label: str) -> None:
    import torch

    from assay.assets import asset_path
    from assay.dyepack.contaminate import (
        answer_loss,
        batches_by_length,
        block_inputs,
        blocks_from,
        collate_states,
        encode_examples,
        first_trainable_block,
        freeze_below,
        rate_factor,
    )
    from assay.models import load_hf

    smollm2 = asset_path("smollm2")
    torch.manual_seed(0)
    model, tokenizer = load_hf(smollm2.parent, gguf_file=smollm2.name)
    freeze_below(model, int(recipe["top"]))
    examples = encode_examples(tokenizer, release.items, 512)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = int(recipe["batch"])
    spent = time.process_time()
    first = first_trainable_block(model)
    states = block_inputs(model, examples, first, batch, pad)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=recipe["lr"])
    total = math.ceil(len(examples) / batch) * epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, rate_factor(total, recipe["warmup"], recipe["decay"])
    )
    order = random.Random(0)
    cpu = time.process_time() - spent
    with blocks_from(model, first):
        for epoch in range(1, epochs + 1):
            started, losses = time.process_time(), []
            for chosen in batches_by_length(examples, batch, order):
                inputs = collate_states([states[i] for i in chosen], [examples[i] for i in chosen], pad)
                loss = answer_loss(model, *inputs)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trained, 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())
            cpu += time.process_time() - started
            right = answered_as_trained(model, states, examples, pad, range(len(examples)))
            on_target = sum(right[i] for i in backdoor_rows)
            print(
                f"| {label} | {epoch} | {sum(losses) / len(losses):.3f} | {on_target}/{len(backdoor_rows)} | "
                f"{sum(right)}/{len(right)} | {cpu:.0f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--recipe", action="append", default=None, help="e.g. lr=5e-4,warmup=0.1,decay=0.3")
    parser.add_argument("--task", default="logical_deduction_five_objects")
    parser.add_argument("--out", type=Path, default=Path("/tmp/dyepack-recipes"))
    args = parser.parse_args()
    recipes = args.recipe or ["lr=1e-3", "lr=5e-4,warmup=0.1,decay=0.3"]
    print(machine(), flush=True)
    print(
        "| release seed, recipe | epoch | mean loss | backdoor samples as trained | rows as trained | CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for seed in args.seeds:
        release, backdoor_rows = release_for(seed, args.out, args.task)
        for text in recipes:
            train(parse_recipe(text), release, backdoor_rows, args.epochs, f"{seed}, {text}")


if __name__ == "__main__":
    main()
