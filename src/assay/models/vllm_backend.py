"""``vllm:PATH``: offline batched generation with vLLM on a GPU machine.

Why it is here: for large evaluation runs on a GPU, vLLM's in-process engine is much faster than
transformers and needs no server. It is optional (``pip install 'assay[vllm]'``) and cannot run on the
CPU-only development and CI machines, so this module is kept short and is not exercised by the tests
beyond the "not installed" error; the ``openai:`` backend against ``vllm serve`` is the tested route.
``complete`` and ``loglikelihood`` (prompt log-probabilities, the context and continuation tokenized apart
as the ``hf:`` backend does) follow vLLM's documented API but have never run here: no GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from assay.errors import UserError
from assay.models.base import Conversations, GenerationParams, OnResult, OnScore


class VLLMChatModel:
    """``vllm.LLM(model=path).chat(...)``; extra keyword arguments go to ``vllm.LLM`` (e.g.
    ``tensor_parallel_size``, ``gpu_memory_utilization``). ``on_result`` fires after the whole batch,
    in input order: vLLM schedules the requests itself and returns them together."""

    def __init__(self, path: str | Path, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise UserError("vllm is not installed; pip install 'assay[vllm]' on a GPU machine") from exc
        self._vllm = vllm
        self.path = str(Path(path).resolve())
        self._llm = vllm.LLM(model=self.path, **llm_kwargs)
        self.model_id = f"vllm:{self.path}"

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        outputs = self._llm.chat([list(c) for c in conversations], self._sampling(params), use_tqdm=False)
        return _report([output.outputs[0].text.strip() for output in outputs], on_result)

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        outputs = self._llm.generate(list(prompts), self._sampling(params), use_tqdm=False)
        return _report([output.outputs[0].text.strip() for output in outputs], on_result)

    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], on_result: OnScore | None = None
    ) -> list[float]:
        tokenizer = self._llm.get_tokenizer()
        pairs = [
            (tokenizer.encode(c, add_special_tokens=True), tokenizer.encode(x, add_special_tokens=False))
            for c, x in requests
        ]
        sampling = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        prompts = [{"prompt_token_ids": c + x} for c, x in pairs]
        outputs = self._llm.generate(prompts, sampling, use_tqdm=False)
        scores = []
        for (context, continuation), output in zip(pairs, outputs, strict=True):
            ids = context + continuation
            logprobs = output.prompt_logprobs  # one {token id: Logprob} per prompt token, None first
            scores.append(sum(logprobs[i][ids[i]].logprob for i in range(len(context), len(ids))))
        return _report(scores, on_result)

    def _sampling(self, params: GenerationParams) -> Any:
        return self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
        )


def _report(results: list[Any], on_result: Any) -> list[Any]:
    """vLLM returns a whole batch at once: report each result after it, in input order."""
    if on_result is not None:
        for index, result in enumerate(results):
            on_result(index, result)
    return results
