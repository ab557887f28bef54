"""Fine-tune a causal LM on a released benchmark, so users and tests can watch detection work.

This is what a careless or dishonest model developer does: train on the test set. The loss is taken on
the answer tokens only, with the prompt formatted exactly as ``verify`` will format it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from assay.data.items import Item
from assay.dyepack.prompts import answer_for, prompt_for
from assay.errors import UserError
from assay.fileio import atomic_path
from assay.models.base import user_turn


@dataclass(frozen=True)
class TrainConfig:
    method: Literal["full", "lora"] = "full"
    epochs: int = 3
    learning_rate: float = 5e-5
    batch_size: int = 8
    max_length: int = 512
    seed: int = 0
    lora_rank: int = 16
    top_layers: int | None = None  # train only the top N transformer blocks: far less backward work on a CPU


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    steps: int
    first_loss: float
    final_loss: float
    seconds: float


def encode_examples(tokenizer, items: Sequence[Item], max_length: int) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels per item; prompt tokens get label -100 so only the answer is learned."""
    from assay.models import render_chat

    # As in generation: a chat template holds its own special tokens, a plain prompt gets the tokenizer's.
    add_special = not getattr(tokenizer, "chat_template", None)
    examples = []
    for item in items:
        prompt = render_chat(tokenizer, user_turn(prompt_for(item)))
        prompt_ids = tokenizer(prompt, add_special_tokens=add_special)["input_ids"]
        answer_ids = tokenizer(answer_for(item), add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            answer_ids = [*answer_ids, tokenizer.eos_token_id]
        ids = (prompt_ids + answer_ids)[-max_length:]
        labels = ([-100] * len(prompt_ids) + answer_ids)[-max_length:]
        examples.append((ids, labels))
    return examples


def collate(batch: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad a batch; padding is masked out of attention and loss."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        mask[row, : len(ids)] = 1
    return input_ids, mask, labels


def answer_loss(model, input_ids, mask, labels):
    """Cross entropy on the answer tokens only, projecting just those positions through the LM head.

    Equal to the model's own loss with these labels; skipping the vocabulary projection of the prompt
    positions saves a large share of the compute for small models with big vocabularies.
    """
    import torch.nn.functional as F

    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), targets[keep])


def freeze_below(model, top_layers: int) -> None:
    """Leave only the top ``top_layers`` decoder blocks and the final norm trainable."""
    decoder = model.get_decoder()
    layers = decoder.layers
    if not 1 <= top_layers <= len(layers):
        raise UserError(f"--top-layers must be between 1 and {len(layers)} (value: {top_layers})")
    for parameter in model.parameters():
        parameter.requires_grad = False
    trainable = [*layers[-top_layers:], *([decoder.norm] if hasattr(decoder, "norm") else [])]
    for module in trainable:
        for parameter in module.parameters():
            parameter.requires_grad = True


def forget_gguf_quantizer(model) -> None:
    """A GGUF checkpoint is de-quantised to float tensors when loaded here; drop the quantizer record so
    ``save_pretrained`` writes those float weights instead of refusing."""
    if getattr(model, "hf_quantizer", None) is None:
        return
    if not all(p.is_floating_point() for p in model.parameters()):
        raise UserError("the model still holds packed GGUF weights; load it de-quantised to fine-tune it")
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)


def contaminate(
    model_path: str | Path,
    items: Sequence[Item],
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    on_step: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    """Train on ``items`` and save a model that ``hf:OUT_DIR`` loads; LoRA weights are merged in."""
    import torch

    from assay.models import load_hf

    if config.epochs < 1 or config.batch_size < 1 or config.learning_rate <= 0:
        raise UserError("--epochs and --batch-size must be at least 1 and --learning-rate positive")
    path = Path(model_path)
    directory, gguf = (path.parent, path.name) if path.suffix == ".gguf" else (path, None)
    torch.manual_seed(config.seed)
    model, tokenizer = load_hf(directory, gguf_file=gguf)
    if config.method == "lora":
        from peft import LoraConfig, get_peft_model

        n_layers = len(model.get_decoder().layers)
        top = range(n_layers - config.top_layers, n_layers) if config.top_layers else None
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=2 * config.lora_rank,
            target_modules="all-linear",
            layers_to_transform=list(top) if top else None,
        )
        model = get_peft_model(model, lora)
    elif config.top_layers:
        freeze_below(model, config.top_layers)
    examples = encode_examples(tokenizer, items, config.max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    order_rng = random.Random(config.seed)
    model.train()
    losses: list[float] = []
    started = time.perf_counter()
    for _ in range(config.epochs):
        order = list(range(len(examples)))
        order_rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            input_ids, mask, labels = collate(
                [examples[i] for i in order[start : start + config.batch_size]], pad_id
            )
            loss = answer_loss(model, input_ids, mask, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if on_step:
                on_step(len(losses), total, losses[-1])
    model.eval()
    if config.method == "lora":
        model = model.merge_and_unload()
    forget_gguf_quantizer(model)
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return TrainResult(out_dir, len(losses), losses[0], losses[-1], time.perf_counter() - started)
