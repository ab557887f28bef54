"""``vllm:PATH``: offline batched generation with vLLM on a GPU machine.

Why it is here: for large evaluation runs on a GPU, vLLM's in-process engine is much faster than
transformers and needs no server. It is optional (``pip install 'assay[vllm]'``) and cannot run on the
CPU-only development and CI machines, so this module is kept short and is not exercised by the tests
beyond the "not installed" error; the ``openai:`` backend against ``vllm serve`` is the tested route.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from assay.errors import UserError
from assay.models.base import Conversations, GenerationParams, OnResult


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
        sampling = self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
        )
        outputs = self._llm.chat([list(c) for c in conversations], sampling, use_tqdm=False)
        texts = [output.outputs[0].text.strip() for output in outputs]
        if on_result is not None:
            for index, text in enumerate(texts):
                on_result(index, text)
        return texts
