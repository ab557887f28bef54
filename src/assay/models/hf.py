"""``hf:PATH``: transformers causal LMs on CPU, from a model directory or a GGUF file.

Why batched with left padding: decoder-only models continue from the last position, so every prompt in a
batch must end at the same column; padding on the left (with an attention mask, and position ids derived
from it by ``generate``) keeps each prompt's continuation identical to what it would be alone, while the
batch shares one forward pass per new token. Prompts are sorted by length before batching so that little
padding is computed. ``load_hf`` and ``render_chat`` are public because fine-tuning code loads and
formats models the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from assay.errors import UserError
from assay.models.base import Conversation, Conversations, GenerationParams, OnResult, OnScore
from assay.models.python_backend import plain_prompt


def quiet_transformers() -> None:
    """Silence transformers' info/warning logs and progress bars: the CLI shows its own progress."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@contextlib.contextmanager
def _quiet_gguf_bar() -> Iterator[None]:
    """The GGUF de-quantisation bar uses ``tqdm.auto`` directly, ignoring the switch above; mute it here."""
    try:
        import functools

        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - module layout changed; a visible bar is harmless
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:  # pragma: no cover
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


MODEL_CACHE_ENV = "ASSAY_MODEL_CACHE"


def load_hf(
    path: str | Path, gguf_file: str | None = None, *, dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local directory, optionally a GGUF file inside it, never downloading
    (``local_files_only``). A GGUF file is de-quantised to ``dtype`` once and kept as a transformers folder
    (:func:`keep_dequantised`): later loads take about a second instead of ~35 CPU seconds.

    The tokenizer gets ``pad_token = eos_token`` when it has no pad token; its padding side is left as is.
    The model is in eval mode.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise UserError(f"hf model directory not found: {directory}")
    if gguf_file is None:
        return _load(directory, {}, dtype)
    if not (directory / gguf_file).is_file():
        raise UserError(f"GGUF file not found: {directory / gguf_file}")
    return _load_gguf(directory / gguf_file, dtype)


def _load(directory: Path, extra: dict[str, Any], dtype: torch.dtype) -> tuple[Any, Any]:
    """``from_pretrained`` for the tokenizer and the model, errors as one line naming the source."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    kwargs: dict[str, Any] = {"local_files_only": True, **extra}
    try:
        with _quiet_gguf_bar():
            tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        source = directory / extra["gguf_file"] if "gguf_file" in extra else directory
        raise UserError(f"cannot load a causal LM from {source}: {first_line}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def model_cache_root() -> Path:
    """Where de-quantised GGUF models are kept: ``ASSAY_MODEL_CACHE``, else ``$XDG_CACHE_HOME/assay/models``
    (``~/.cache/assay/models``). Not under ``ASSAY_HOME``: the copy depends only on the file's bytes, so every
    home (and every test's throwaway home) can share it."""
    if os.environ.get(MODEL_CACHE_ENV):
        return Path(os.environ[MODEL_CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "assay" / "models"


def gguf_key(file: Path, dtype: torch.dtype) -> str:
    """The cache key of a de-quantised GGUF file: its content's sha256 (a file changed in place is a new
    model), the dtype, and the transformers version (whose conversion made the copy)."""
    import transformers

    digest = hashlib.sha256(content_sha256(file).encode())
    digest.update(f"|{dtype}|transformers {transformers.__version__}".encode())
    return digest.hexdigest()[:32]


RACY_SECONDS = 2


def content_sha256(file: Path) -> str:
    """The sha256 of ``file``'s bytes, remembered in the model cache by the file's device, inode, size and
    mtime, as make and ccache trust them: hashing a multi-GB GGUF file on every load took seconds (0.2 s
    for SmolLM2's 100 MB). A file rewritten in place gets a new mtime, so it is hashed again; one changed in
    the last ``RACY_SECONDS`` is not remembered, since a second write within the file system's clock tick
    could keep its size and mtime (git's "racily clean" entries)."""
    import json

    stat = file.stat()
    seen = {"dev": stat.st_dev, "ino": stat.st_ino, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    where = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:32]
    memo = model_cache_root() / "hashes" / f"{where}.json"
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(memo.read_text(encoding="utf-8"))
        if {name: kept.get(name) for name in seen} == seen and isinstance(kept.get("sha256"), str):
            return kept["sha256"]
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    if time.time_ns() - stat.st_mtime_ns < RACY_SECONDS * 1e9:
        return digest.hexdigest()
    with contextlib.suppress(OSError):  # an unwritable cache: hash again next time
        memo.parent.mkdir(parents=True, exist_ok=True)
        scratch = memo.with_name(f".{memo.name}.{os.getpid()}")
        scratch.write_text(json.dumps({**seen, "sha256": digest.hexdigest()}), encoding="utf-8")
        scratch.replace(memo)
    return digest.hexdigest()


def _load_gguf(file: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """A GGUF model from its de-quantised copy, or converted now and the copy kept for next time.

    transformers parses the GGUF three times (config, tokenizer, weights), ~35 CPU seconds for
    SmolLM2-135M; the copy loads in about half a second."""
    target = model_cache_root() / gguf_key(file, dtype)
    if (target / "config.json").is_file():
        return _load(target, {}, dtype)
    model, tokenizer = _load(file.parent, {"gguf_file": file.name}, dtype)
    forget_gguf_quantizer(model)
    keep_dequantised(model, tokenizer, target)
    return model, tokenizer


def keep_dequantised(model: Any, tokenizer: Any, target: Path) -> bool:
    """Save a complete copy at ``target``: written beside it and renamed in, so a reader never sees half a
    folder; when two processes race, the first rename wins and the other's copy goes. A cache that cannot
    be written (a read-only home) costs the next load a conversion, never this one: a warning, False."""
    import shutil
    import tempfile

    scratch = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        model.save_pretrained(scratch / "model")
        tokenizer.save_pretrained(scratch / "model")
        with contextlib.suppress(OSError):  # another process renamed its copy first: keep that one
            (scratch / "model").rename(target)
    except OSError as error:
        warnings.warn(
            f"cannot keep the de-quantised model in {target.parent} ({error}); the next load converts the "
            f"GGUF file again (set {MODEL_CACHE_ENV} to a writable folder)",
            stacklevel=2,
        )
        return False
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return True


def forget_gguf_quantizer(model: Any) -> None:
    """A GGUF checkpoint is de-quantised to float tensors when loaded here; drop the quantizer record so
    ``save_pretrained`` writes those float weights instead of refusing."""
    if getattr(model, "hf_quantizer", None) is None:
        return
    if not all(p.is_floating_point() for p in model.parameters()):
        raise UserError("the model still holds packed GGUF weights; load it de-quantised to fine-tune it")
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)


def render_chat(tokenizer: Any, conversation: Conversation, add_generation_prompt: bool = True) -> str:
    """The prompt text for ``conversation``: the tokenizer's chat template when it has one, otherwise
    :func:`~assay.models.python_backend.plain_prompt` (a single user turn is exactly its text)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            list(conversation), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    return plain_prompt(conversation, add_generation_prompt=add_generation_prompt)


class HFChatModel:
    """Greedy (temperature 0) or sampled generation with a transformers causal LM, ``batch_size`` prompts
    per ``generate`` call.

    ``on_result(i, text)`` fires for each item as its batch finishes; batches follow prompt length, so
    the order of calls is not input order (``i`` is always the input position). With sampling, the
    seed is set once per call (``torch.manual_seed(params.seed)``), so a reply depends on its batch.
    """

    def __init__(
        self,
        path: str | Path,
        gguf_file: str | None = None,
        batch_size: int = 8,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1, got {batch_size}")
        self.path = Path(path).resolve()
        self.gguf_file = gguf_file
        model, tokenizer = load_hf(self.path, gguf_file, dtype=dtype)
        weights = self.path / gguf_file if gguf_file else self.path
        self._adopt(model, tokenizer, f"hf:{weights}@{_fingerprint(self.path, gguf_file)}", batch_size)

    @classmethod
    def in_memory(cls, model: Any, tokenizer: Any, model_id: str, batch_size: int = 8) -> HFChatModel:
        """Ask a model that lives in this process (one being trained) without saving and reloading it.

        WHY: ``contaminate --until`` asks the model the release's questions between epochs; a round trip
        through the disk would cost more than the epoch. The caller puts the model in eval mode."""
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1, got {batch_size}")
        self = cls.__new__(cls)
        self.path, self.gguf_file = None, None
        self._adopt(model, tokenizer, model_id, batch_size)
        return self

    def _adopt(self, model: Any, tokenizer: Any, model_id: str, batch_size: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = batch_size
        self.share_contexts = True  # score_ids: one pass per distinct context (False: each pair whole)
        self._uses_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.model_id = model_id

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        prompts = [render_chat(self.tokenizer, c) for c in conversations]
        # Templates already hold the special tokens (BOS etc.); plain prompts get the tokenizer's own.
        return self._continue(prompts, params, on_result, add_special=not self._uses_template)

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """Continue each text as it is, without the chat template (a base model, scraped-text training)."""
        return self._continue(list(prompts), params, on_result, add_special=True)

    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], on_result: OnScore | None = None
    ) -> list[float]:
        """log P(continuation | context) for plain text. Context and continuation are tokenized apart (the
        context with the tokenizer's special tokens), as fine-tuning joins a prompt and its answer, so a
        model is scored on exactly the token sequence it was trained on. Each distinct context is tokenized
        once; :meth:`score_ids` runs it once for all its continuations."""
        encode = self.tokenizer
        contexts = {
            c: encode(c, add_special_tokens=True)["input_ids"] for c in dict.fromkeys(c for c, _ in requests)
        }
        pairs = [(contexts[c], encode(x, add_special_tokens=False)["input_ids"]) for c, x in requests]
        return self.score_ids(pairs, on_result)

    @torch.inference_mode()
    def score_ids(
        self, pairs: Sequence[tuple[list[int], list[int]]], on_result: OnScore | None = None
    ) -> list[float]:
        """Sum of log-probabilities of each continuation's ids after its context's ids.

        Pairs that share a context (the K options of a question) are scored from one pass over it, batched
        across contexts, ``batch_size`` contexts per pass (:func:`~assay.models.hf_scoring.score_shared`);
        ``share_contexts = False`` reads each pair as one whole row instead, ``batch_size`` rows per pass
        (:func:`~assay.models.hf_scoring.score_joined`, the reference the benchmark compares with). Both
        give the same numbers up to float rounding; ``on_result`` may fire out of input order."""
        from assay.models.hf_scoring import score_joined, score_shared

        pad = self.tokenizer.pad_token_id or 0
        scorer = score_shared if self.share_contexts else score_joined
        return scorer(self.model, pairs, self.batch_size, pad, on_result)

    def _continue(
        self, prompts: list[str], params: GenerationParams, on_result: OnResult | None, add_special: bool
    ) -> list[str]:
        """Generate after each prompt, batched by length (see the class docstring)."""
        lengths = [len(self.tokenizer(p, add_special_tokens=add_special)["input_ids"]) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
        results: list[str] = [""] * len(prompts)
        if params.temperature > 0 and params.seed is not None:
            torch.manual_seed(params.seed)
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            texts = self._generate([prompts[i] for i in indices], params, add_special)
            for index, text in zip(indices, texts, strict=True):
                results[index] = text
                if on_result is not None:
                    on_result(index, text)
        return results

    @torch.inference_mode()
    def _generate(self, prompts: list[str], params: GenerationParams, add_special: bool) -> list[str]:
        encoded = self.tokenizer(
            prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=add_special
        )
        options: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if params.temperature == 0:
            # Unset the sampling knobs a checkpoint's generation_config may carry, so greedy is plain greedy.
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            options.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=None)
        output = self.model.generate(**encoded, **options)
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        return [t.strip() for t in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]


def _fingerprint(directory: Path, gguf_file: str | None) -> str:
    """Size and mtime of the weight and config files: a retrained model at the same path is a new model
    for the response cache, without hashing gigabytes."""
    if gguf_file is not None:
        files = [directory / gguf_file]
    else:
        patterns = ("*.safetensors", "*.bin", "*.gguf", "config.json", "tokenizer*.json")
        files = sorted({f for pattern in patterns for f in directory.glob(pattern)})
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:12]
