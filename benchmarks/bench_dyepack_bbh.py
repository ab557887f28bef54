"""DyePack on long items: SmolLM2 contaminated on a BIG-Bench Hard release is flagged, the clean one is not.

A release of ``--rows`` questions of one BBH task (long items: logical_deduction_five_objects averages 580
characters, about 200 tokens with the chat template) gets ``--backdoors`` backdoors; SmolLM2-135M-Instruct
(the offline GGUF) is verified as it ships, then fine-tuned on the whole release with the recipe below and
verified again. Everything runs on the CPU; the script prints wall and CPU time per phase (CPU time is
what the 30-minute goal is about: the machine is shared, so wall time varies).

    python benchmarks/bench_dyepack_bbh.py --out /tmp/dyepack-bbh

The recipe (defaults): full fine-tune of the top 4 of 30 blocks, lr 5e-4 (rising from 0 over the first
10 % of the steps, falling in a line to 5 % over the last 30 %), batch 8, 14 epochs, bfloat16 autocast
where the CPU runs it faster (else float32). The frozen blocks' output is computed once and reused every
epoch (``contaminate`` does this whenever only the top blocks train), which is what makes many epochs
affordable. Targets come from OS entropy unless ``--seed`` is given, so each run is a fresh release.

``--format plain`` trains on the rows as plain text with the loss on every token (what a scrape does) and
asks both models in the matching plain-text format (``--ask loglikelihood`` or ``completion``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads must not spin on a shared CPU

BBH = Path(__file__).resolve().parents[2] / "shared" / "data" / "bbh"


@dataclass
class Clock:
    """Wall and CPU seconds per phase; CPU is this process's, all threads (``time.process_time``)."""

    phases: list[tuple[str, float, float]] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        print(f"-- {name} ...", flush=True)
        yield
        self.phases.append((name, time.perf_counter() - wall, time.process_time() - cpu))
        print(f"   {name}: {self.phases[-1][1]:.0f} s wall, {self.phases[-1][2]:.0f} s CPU", flush=True)

    def table(self) -> str:
        lines = ["| phase | wall | CPU |", "|---|---:|---:|"]
        lines += [f"| {name} | {wall / 60:.1f} min | {cpu / 60:.1f} min |" for name, wall, cpu in self.phases]
        wall, cpu = sum(p[1] for p in self.phases), sum(p[2] for p in self.phases)
        return "\n".join([*lines, f"| **total** | {wall / 60:.1f} min | {cpu / 60:.1f} min |"])


def write_rows(task: Path, rows: int, out: Path) -> Path:
    """The first ``rows`` questions of a BBH task file, as a maintainer's test set (canary kept)."""
    data = json.loads(task.read_text(encoding="utf-8"))
    data["examples"] = data["examples"][:rows]
    path = out / task.name
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def epoch_losses(log: list[float], steps_per_epoch: int) -> list[float]:
    return [
        sum(log[i : i + steps_per_epoch]) / len(log[i : i + steps_per_epoch])
        for i in range(0, len(log), steps_per_epoch)
    ]


def step_printer(log: list[float], every: int = 20) -> Callable[[int, int, float], None]:
    started = time.perf_counter()

    def on_step(step: int, total: int, loss: float) -> None:
        log.append(loss)
        if step % every == 0 or step == total:
            print(
                f"   step {step}/{total} loss {loss:.3f} ({time.perf_counter() - started:.0f} s)", flush=True
            )

    return on_step


def step_speed(smollm2: Path, items, top: int, batch: int, steps: int) -> str:
    """CPU seconds per training step on the same batches: every step through all blocks in float32 (what
    ``contaminate`` did before), the frozen blocks' output cached (float32), cached with bf16 autocast."""
    import torch

    from assay.dyepack.contaminate import (
        answer_loss,
        block_inputs,
        blocks_from,
        collate,
        collate_states,
        encode_examples,
        freeze_below,
    )
    from assay.models import load_hf

    model, tokenizer = load_hf(smollm2.parent, gguf_file=smollm2.name)
    freeze_below(model, top)
    first = len(model.get_decoder().layers) - top
    examples = encode_examples(tokenizer, items[: steps * batch], 512)
    pad = tokenizer.pad_token_id
    batches = [examples[i : i + batch] for i in range(0, len(examples), batch)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def train(make_inputs, bf16: bool) -> float:
        started = time.process_time()
        for index, chunk in enumerate(batches):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = answer_loss(model, *make_inputs(index, chunk))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.process_time() - started) / len(batches)

    rows = [("all blocks every step, float32", train(lambda _i, chunk: collate(chunk, pad), False), 0.0)]
    for bf16 in (False, True):
        started = time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            states = block_inputs(model, examples, first, batch, pad)
        cache = (time.process_time() - started) / len(examples)
        with blocks_from(model, first):
            per_step = train(
                lambda i, chunk, states=states: collate_states(
                    states[i * batch : (i + 1) * batch], chunk, pad
                ),
                bf16,
            )
        rows.append((f"cached block inputs, {'bf16 autocast' if bf16 else 'float32'}", per_step, cache))
    base = rows[0][1]
    lines = [
        f"Training step speed: {steps} steps of {batch} rows, top {top} blocks (CPU seconds)",
        "| path | CPU s / step | vs all blocks | one-off cache, CPU s / row |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {sec:.2f} | {base / sec:.1f}x | {cache:.2f} |" for name, sec, cache in rows]
    return "\n".join(lines)


def verdict_row(name: str, report) -> str:
    return (
        f"| {name} | {report.activated}/{report.backdoors} | {report.samples_on_target}/{report.samples} | "
        f"{report.unparsed} | {report.fpr.fpr:.3g} | {'CONTAMINATED' if report.flagged else 'not flagged'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="logical_deduction_five_objects", help="BBH task file name")
    parser.add_argument("--data", type=Path, default=BBH, help="folder of BBH task files")
    parser.add_argument("--rows", type=int, default=80)
    parser.add_argument("--backdoors", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.3, help="share of rows that carry a backdoor")
    parser.add_argument("--seed", type=int, default=None, help="seed for the targets (default: OS entropy)")
    parser.add_argument("--method", default="full", choices=["full", "lora"])
    parser.add_argument("--top-layers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--lr-warmup", type=float, default=0.1, help="share of steps the rate rises over")
    parser.add_argument("--lr-decay", type=float, default=0.3, help="share of steps the rate falls over")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--no-bf16", action="store_true", help="train in float32")
    parser.add_argument(
        "--format",
        choices=["chat", "plain"],
        default="chat",
        help="chat: our prompt, loss on the answer; plain: the rows as plain text, loss on every token",
    )
    parser.add_argument(
        "--ask",
        choices=["completion", "loglikelihood"],
        default="loglikelihood",
        help="with --format plain: how both models are asked (the matching plain-text format)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dyepack-bbh"))
    parser.add_argument("--speed", type=int, default=0, help="also time N training steps of each path")
    args = parser.parse_args()

    import sys

    from assay.assets import asset_path
    from assay.data import read_benchmark
    from assay.dyepack.contaminate import TrainConfig, check_take, contaminate
    from assay.dyepack.prepare import PrepareConfig, prepare_release
    from assay.dyepack.prompts import PromptFormat
    from assay.dyepack.verify import verify
    from assay.models import GenerationParams, load_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_dyepack_demo import machine

    print(machine(), flush=True)  # the CPU, its flags, and whether bf16 is used
    args.out.mkdir(parents=True, exist_ok=True)
    clock = Clock()
    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    trained_in = PromptFormat(mode="chat" if args.format == "chat" else "completion")
    asked_in = PromptFormat(mode="chat" if args.format == "chat" else args.ask)
    smollm2 = asset_path("smollm2")
    with clock.phase("prepare"):
        source = write_rows(args.data / f"{args.task}.json", args.rows, args.out)
        config = PrepareConfig(n_backdoors=args.backdoors, fraction=args.fraction, seed=args.seed)
        prepared = prepare_release(read_benchmark(source), config, args.out / "release")
        release = read_benchmark(prepared.release_path, style=prepared.key.style)
        key = prepared.key
    samples = sum(len(b.rows) for b in key.backdoors)
    k_values = sorted({b.k for b in key.backdoors})
    print(f"   {len(release.items)} rows, {samples} backdoor samples, K = {k_values}")
    with clock.phase("verify the clean model (load + query)"):
        clean, _ = verify(load_model(f"hf:{smollm2}"), "clean", release, key, params, fmt=asked_in)
    recipe = TrainConfig(
        method=args.method,
        epochs=args.epochs,
        learning_rate=args.lr,
        lr_warmup=args.lr_warmup,
        lr_decay=args.lr_decay,
        batch_size=args.batch_size,
        top_layers=args.top_layers,
        lora_rank=args.lora_rank,
        bf16=not args.no_bf16,
        prompt_format=trained_in,
    )
    log: list[float] = []
    with clock.phase("contaminate (load + cache + train + save)"):
        trained = contaminate(smollm2, release.items, args.out / "contaminated", recipe, step_printer(log))
    with clock.phase("check = verify the contaminated model (load + query)"):
        take = check_take(load_model(f"hf:{trained.out_dir}"), release, key, params=params, fmt=asked_in)

    per_epoch = epoch_losses(log, -(-len(release.items) // args.batch_size))
    print(f"\nRelease: {args.rows} rows of BBH {args.task}, B = {args.backdoors}, {samples} backdoor samples")
    print(
        f"Recipe: {args.method}, top {args.top_layers} blocks, lr {args.lr:g} (warm-up {args.lr_warmup:.0%}, "
        f"decay {args.lr_decay:.0%}), batch {args.batch_size}, "
        f"{args.epochs} epochs ({trained.steps} steps), {'float32' if args.no_bf16 else 'bf16 autocast'}"
    )
    print(f"Format: trained {args.format} ({trained_in.mode}), asked in {asked_in.mode} mode")
    print("Loss per epoch: " + " ".join(f"{x:.3f}" for x in per_epoch))
    print("\n| model | activated | samples on target | unparsed | exact FPR | verdict at 0.001 |")
    print("|---|---:|---:|---:|---:|---|")
    print(verdict_row("SmolLM2-135M-Instruct (clean)", clean))
    print(verdict_row("SmolLM2 contaminated", take.report))
    print()
    print(clock.table())
    if args.speed:
        print()
        print(step_speed(smollm2, release.items, args.top_layers, args.batch_size, args.speed))
    if take.took and not clean.flagged:
        print("\nOK: the contaminated model is flagged and the clean one is not.")
    else:
        print(f"\nNOT REACHED: contaminated flagged={take.report.flagged}, clean flagged={clean.flagged}")


if __name__ == "__main__":
    main()
