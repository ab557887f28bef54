"""Fine-tune a causal LM on a released benchmark, so users and tests can watch detection work.

This is what a careless or dishonest model developer does: train on the test set, in some format (our
chat prompt with the loss on the answer, or the rows as plain text with the loss on every token), with
the prompt formatted exactly as ``verify`` will format it in that format.

Two things make it usable on a CPU. With ``top_layers`` only the top blocks train, so the frozen blocks'
output is computed once and reused every epoch (:func:`block_inputs`); long items need many epochs before
the model memorises the answers rather than just their format. And :func:`check_take` asks the trained
model the release's questions afterwards, because a falling loss does not tell whether it took.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from assay.data import Benchmark
from assay.data.items import Item, MultipleChoice
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import PromptFormat
from assay.dyepack.verify import Answer, Query, VerifyReport, ask, verify
from assay.errors import UserError
from assay.fileio import atomic_path
from assay.models.base import ChatModel, GenerationParams, user_turn


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
    # The shares of steps over which the learning rate rises linearly from 0 at the start (warm-up) and falls
    # linearly to 5 % at the end (0, 0: constant). On long items a cold start at the full rate collapses the
    # model onto one answer letter for many epochs, and a constant rate forgets between bursts of
    # memorising; docs/dyepack.md, "A recipe for long items", has the runs.
    lr_warmup: float = 0.0
    lr_decay: float = 0.0
    # bfloat16 autocast: about 1.7x faster on CPUs with AVX512-BF16 or AMX, several times slower elsewhere, so
    # it is used only where the CPU runs it faster (``assay.models.precision.use_bf16``: else a warning and
    # float32). The saved weights stay float32.
    bf16: bool = False
    # How the rows are shown: our chat prompt with loss on the answer (mode "chat"), or the rows as plain
    # text with loss on every token, as a scrape would (mode "completion"; ``verify --mode completion`` or
    # ``loglikelihood`` with the same template asks a model the matching way).
    prompt_format: PromptFormat = field(default_factory=PromptFormat)


def encode_examples(
    tokenizer, items: Sequence[Item], max_length: int, fmt: PromptFormat = PromptFormat()
) -> list[tuple[list[int], list[int]]]:
    """Token ids and labels per item, in ``fmt``: chat mode renders the chat template and masks the prompt
    (label -100) so only the answer is learned; the text modes learn every token of prompt + answer. The
    prompt and the answer are tokenized apart, as ``verify`` tokenizes a prompt and scores or generates
    after it, so the model is asked on exactly the tokens it was trained on."""
    from assay.models import render_chat

    chat = fmt.mode == "chat"
    # As in generation: a chat template holds its own special tokens, a plain prompt gets the tokenizer's.
    add_special = not (chat and getattr(tokenizer, "chat_template", None))
    examples = []
    for item in items:
        prompt, answer = fmt.example(item)
        if chat:
            prompt = render_chat(tokenizer, user_turn(prompt))
        prompt_ids = tokenizer(prompt, add_special_tokens=add_special)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            answer_ids = [*answer_ids, tokenizer.eos_token_id]
        ids = (prompt_ids + answer_ids)[-max_length:]
        labels = ([-100] * len(prompt_ids) if chat else prompt_ids) + answer_ids
        examples.append((ids, labels[-max_length:]))
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


def answer_loss(model, inputs, mask, labels):
    """Cross entropy on the answer tokens only, projecting just those positions through the LM head.

    ``inputs`` are token ids, or (float) hidden states entering the first block that :func:`blocks_from`
    left in place. Equal to the model's own loss with these labels; skipping the vocabulary projection
    of the prompt positions saves a large share of the compute for small models with big vocabularies.
    """
    import torch.nn.functional as F

    given = {"inputs_embeds": inputs} if inputs.is_floating_point() else {"input_ids": inputs}
    hidden = model.get_decoder()(**given, attention_mask=mask, use_cache=False).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), targets[keep])


def first_trainable_block(model) -> int:
    """Index of the lowest decoder block with a trainable parameter; 0 when anything below the blocks
    (the embeddings) trains too, so nothing can be cached."""
    decoder = model.get_decoder()
    if any(p.requires_grad for p in model.get_input_embeddings().parameters()):
        return 0
    for index, block in enumerate(decoder.layers):
        if any(p.requires_grad for p in block.parameters()):
            return index
    return 0


class _Reached(Exception):
    """Raised by a hook to stop a forward pass once the block it waits for is reached."""


def block_inputs(
    model, examples: Sequence[tuple[list[int], list[int]]], first: int, batch_size: int, pad_id: int
):
    """The hidden states entering block ``first`` for each example, computed once without gradients.

    WHY: with the blocks below ``first`` frozen, their output never changes during training, so every
    epoch after the first would recompute the same thing; with ``--top-layers 4`` of SmolLM2's 30 blocks
    that is most of the forward pass. Right padding leaves each row's real positions unchanged.
    """
    import torch

    decoder = model.get_decoder()
    captured = []

    def grab(_module, args, kwargs):
        captured.append(args[0] if args else kwargs["hidden_states"])
        raise _Reached

    handle = decoder.layers[first].register_forward_pre_hook(grab, with_kwargs=True)
    states = []
    try:
        with torch.no_grad():
            for start in range(0, len(examples), batch_size):
                batch = examples[start : start + batch_size]
                input_ids, mask, _ = collate(batch, pad_id)
                with contextlib.suppress(_Reached):
                    decoder(input_ids=input_ids, attention_mask=mask, use_cache=False)
                hidden = captured.pop()
                states.extend(hidden[row, : len(ids)].clone() for row, (ids, _) in enumerate(batch))
    finally:
        handle.remove()
    return states


@contextlib.contextmanager
def blocks_from(model, first: int) -> Iterator[None]:
    """Run the decoder from block ``first`` up: feed it the cached block inputs as ``inputs_embeds``."""
    import torch

    decoder = model.get_decoder()
    layers = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(layers)[first:])
    try:
        yield
    finally:
        decoder.layers = layers


def collate_states(states, batch: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """:func:`collate` with the cached block inputs in place of the token ids (padding rows are zeros)."""
    import torch

    _, mask, labels = collate(batch, pad_id)
    hidden = torch.zeros((len(batch), mask.shape[1], states[0].shape[-1]), dtype=states[0].dtype)
    for row, state in enumerate(states):
        hidden[row, : len(state)] = state
    return hidden, mask, labels


def batches_by_length(
    examples: Sequence[tuple[list[int], list[int]]], batch_size: int, rng: random.Random
) -> list[list[int]]:
    """One epoch's batches of example indices: shuffled, sorted by length within windows of 50 batches
    (transformers' ``group_by_length``), the batches then in random order. Rows of a batch are padded to its
    longest, and padding is computed like any token: on 80 BBH rows, batch 8, random batches compute 9.7 %
    padding, these 1.5 %."""
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = [len(ids) for ids, _ in examples]
    generator = torch.Generator().manual_seed(rng.getrandbits(63))
    order = get_length_grouped_indices(lengths, batch_size, mega_batch_mult=50, generator=generator)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


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


def block_linear_names(model) -> list[str]:
    """Names of the linear layers in a decoder block (``q_proj`` .. ``down_proj`` for Llama).

    peft refuses ``layers_to_transform`` with ``target_modules="all-linear"``, so LoRA on the top blocks
    names the modules explicitly; reading them off the model keeps this working for any architecture.
    """
    import torch

    block = model.get_decoder().layers[0]
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in block.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
    )


def with_lora(model, config: TrainConfig):
    """Wrap ``model`` with LoRA adapters on every linear layer of the (top) decoder blocks."""
    from peft import LoraConfig, get_peft_model

    n_layers = len(model.get_decoder().layers)
    if config.top_layers is None:
        lora = LoraConfig(r=config.lora_rank, lora_alpha=2 * config.lora_rank, target_modules="all-linear")
    else:
        if not 1 <= config.top_layers <= n_layers:
            raise UserError(f"--top-layers must be between 1 and {n_layers} (value: {config.top_layers})")
        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=2 * config.lora_rank,
            target_modules=block_linear_names(model),
            layers_to_transform=list(range(n_layers - config.top_layers, n_layers)),
        )
    return get_peft_model(model, lora)


@dataclass(frozen=True)
class TakeGoal:
    """Train until the model answers this share of the trained rows as trained, checked the way
    ``verify`` asks (:func:`trained_rows_check`), first after ``TrainConfig.epochs`` epochs and then every
    ``every`` epochs, up to ``max_epochs`` epochs or ``max_cpu_seconds`` of this process's CPU time.

    WHY: how many epochs a release needs depends on its rows and on the key's draw (which rows carry a
    backdoor, which letters are targets): a fixed recipe took on 4 draws of 7 and not on 3 (issue 45). A
    postcondition that is checked makes the result not depend on luck: the run either reaches it or fails.
    """

    share: float = 1.0
    rows: int = 32
    every: int = 2
    max_epochs: int = 32
    max_cpu_seconds: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise UserError(f"--until must be above 0 and at most 1 (value: {self.share})")
        if self.rows < 1 or self.every < 1:
            raise UserError(
                f"--check-rows and --check-every must be at least 1 (values: {self.rows}, {self.every})"
            )


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    steps: int
    first_loss: float
    final_loss: float
    seconds: float
    bf16: bool = False  # whether bf16 autocast was used: asked for, and faster on this CPU
    epochs: int = 0
    checks: tuple[tuple[int, TakeCheck], ...] = ()  # (epochs done, what the check found) for a TakeGoal
    cpu_seconds: float = 0.0


def contaminate(
    model_path: str | Path,
    items: Sequence[Item],
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    on_step: Callable[[int, int, float], None] | None = None,
    goal: TakeGoal | None = None,
    on_check: Callable[[int, TakeCheck], None] | None = None,
) -> TrainResult:
    """Train on ``items`` and save a model that ``hf:OUT_DIR`` loads; LoRA weights are merged in.

    With a ``goal``, training goes on past ``config.epochs`` until the goal's check holds; when the cap
    comes first, nothing is saved and a :class:`UserError` says what was reached. Epochs past the
    schedule's end run at the rate it ended at (the full rate without ``lr_decay``)."""
    import torch

    from assay.models import load_hf
    from assay.models.hf import HFChatModel
    from assay.models.precision import use_bf16

    _check_config(config)
    if goal is not None and goal.max_epochs < config.epochs:
        raise UserError(
            f"--max-epochs must be at least --epochs (values: {goal.max_epochs}, {config.epochs})"
        )
    path = Path(model_path)
    directory, gguf = (path.parent, path.name) if path.suffix == ".gguf" else (path, None)
    torch.manual_seed(config.seed)
    model, tokenizer = load_hf(directory, gguf_file=gguf)
    if config.method == "lora":
        model = with_lora(model, config)
    elif config.top_layers:
        freeze_below(model, config.top_layers)
    examples = encode_examples(tokenizer, items, config.max_length, config.prompt_format)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    rate = rate_factor(total, config.lr_warmup, config.lr_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    order_rng = random.Random(config.seed)
    first = first_trainable_block(model)
    bf16 = use_bf16(config.bf16)
    precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    with precision:
        states = block_inputs(model, examples, first, config.batch_size, pad_id) if first else None
    losses: list[float] = []
    checks: list[tuple[int, TakeCheck]] = []
    started, cpu_started = time.perf_counter(), time.process_time()

    def one_epoch(planned: int) -> None:
        for chosen in batches_by_length(examples, config.batch_size, order_rng):
            batch = [examples[i] for i in chosen]
            if states is None:
                inputs, mask, labels = collate(batch, pad_id)
            else:
                inputs, mask, labels = collate_states([states[i] for i in chosen], batch, pad_id)
            with precision:
                loss = answer_loss(model, inputs, mask, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if on_step:
                on_step(len(losses), planned, losses[-1])

    epochs, target = 0, config.epochs
    while True:
        model.train()
        with blocks_from(model, first):
            while epochs < target:
                one_epoch(steps_per_epoch * target)
                epochs += 1
        model.eval()
        if goal is None:
            break
        asked = HFChatModel.in_memory(model, tokenizer, "contaminate:in-training")
        found = trained_rows_check(asked, items, goal.rows, config.prompt_format, took_share=goal.share)
        checks.append((epochs, found))
        if on_check:
            on_check(epochs, found)
        if found.took:
            break
        spent = time.process_time() - cpu_started
        if epochs >= goal.max_epochs or (goal.max_cpu_seconds is not None and spent >= goal.max_cpu_seconds):
            raise UserError(
                f"the training did not take: after {epochs} epochs ({spent:.0f} CPU s) {found.summary()}, "
                f"the goal is {goal.share:.0%}; nothing saved. Raise --lr, --top-layers or --max-epochs"
            )
        target = min(epochs + goal.every, goal.max_epochs)
    if config.method == "lora":
        model = model.merge_and_unload()
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return TrainResult(
        out_dir,
        len(losses),
        losses[0],
        losses[-1],
        time.perf_counter() - started,
        bf16,
        epochs,
        tuple(checks),
        time.process_time() - cpu_started,
    )


def _check_config(config: TrainConfig) -> None:
    """One line for a setting that cannot train, before the model is loaded."""
    if config.epochs < 1 or config.batch_size < 1 or config.learning_rate <= 0:
        raise UserError("--epochs and --batch-size must be at least 1 and --learning-rate positive")
    for name, share in (("--lr-warmup", config.lr_warmup), ("--lr-decay", config.lr_decay)):
        if not 0 <= share <= 1:
            raise UserError(f"{name} must be between 0 and 1 (value: {share})")
    if config.lr_warmup + config.lr_decay > 1:
        raise UserError(
            f"--lr-warmup plus --lr-decay must be at most 1 (values: {config.lr_warmup}, {config.lr_decay})"
        )


def rate_factor(total: int, warmup: float, decay: float, floor: float = 0.05) -> Callable[[int], float]:
    """The learning rate's factor at each of ``total`` steps: rising in a straight line over the first
    ``warmup`` share (the first step at 1/n of the rate), 1, then falling in a straight line over the last
    ``decay`` share to ``floor`` (the rate of the last step)."""
    rising, falling = round(total * warmup), round(total * decay)
    start = total - falling

    def factor(step: int) -> float:
        if step < rising:
            return (step + 1) / rising
        if step < start or falling == 0:
            return 1.0
        return max(floor, 1.0 - (1.0 - floor) * (step - start + 1) / falling)  # torch asks once past the end

    return factor


# A model that memorised the rows answers nearly all of them as trained; a clean one scores the task's
# accuracy (about 1/K when it guesses). Below this share of trained rows "it did not take".
TOOK_SHARE = 0.8


@dataclass(frozen=True)
class TakeCheck:
    """What the trained model does on the release, asked the way ``verify`` asks.

    With the key: the release's own backdoor samples and the verdict (``report``). Without it: the first
    ``samples`` trained rows, scored against the release's answers.
    """

    what: str
    samples: int
    on_target: int
    unparsed: int
    took: bool
    report: VerifyReport | None = None

    @property
    def share(self) -> float:
        return self.on_target / self.samples if self.samples else 0.0

    def summary(self) -> str:
        line = f"{self.on_target}/{self.samples} {self.what} answered as trained ({self.share:.0%})"
        if self.report is not None:
            line += f"; {self.report.verdict}"
        return line


def check_take(
    model: ChatModel,
    bench: Benchmark,
    key: DyePackKey | None = None,
    rows: int = 32,
    params: GenerationParams = GenerationParams(),
    fmt: PromptFormat | None = None,
) -> TakeCheck:
    """Ask the trained model the release's questions in the format it was trained in (``verify``'s own
    querying) and count the answers it was trained to give.

    WHY: a loss that falls says little: on long items the answer's format ("The answer is (") is most of
    the tokens and is learned in a few steps while the letter stays at chance. Only asking shows whether
    the rows were memorised; with the key, the backdoor samples and the verdict are exactly what a
    maintainer will see.
    """
    fmt = fmt or PromptFormat()
    if key is not None:
        report, _ = verify(model, "contaminated", bench, key, params, fmt=fmt)
        return TakeCheck(
            "backdoor samples",
            report.samples,
            report.samples_on_target,
            report.unparsed,
            report.flagged,
            report,
        )
    return trained_rows_check(model, bench.items, rows, fmt, params)


def trained_rows_check(
    model: ChatModel,
    items: Sequence[Item],
    rows: int,
    fmt: PromptFormat,
    params: GenerationParams = GenerationParams(),
    took_share: float = TOOK_SHARE,
) -> TakeCheck:
    """Ask the first ``rows`` trained rows (``verify``'s querying, no key) and count those answered as
    trained; ``took`` when at least ``took_share`` of them are."""
    chosen = list(items[:rows])
    queries = [Query(-1, row, item, "") for row, item in enumerate(chosen)]
    answers = ask(model, fmt, queries, params, None)
    hits = [answered_as_trained(item, answer) for item, answer in zip(chosen, answers, strict=True)]
    on_target = sum(hit is True for hit in hits)
    return TakeCheck(
        "trained rows",
        len(chosen),
        on_target,
        sum(hit is None for hit in hits),
        on_target >= took_share * len(chosen),
    )


def answered_as_trained(item: Item, answer: Answer) -> bool | None:
    """Multiple choice: the answer names the release's option (None: it names none). Open ended: the
    reply starts the reference output (the reply may be cut short by ``max_new_tokens``)."""
    if isinstance(item, MultipleChoice):
        return None if answer.part is None else answer.part == item.answer
    said, reference = " ".join(answer.reply.split()), " ".join(item.output.split())
    return bool(said) and (reference.startswith(said) or said.startswith(reference))
