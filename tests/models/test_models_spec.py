"""Model spec strings and the python: backend."""

from __future__ import annotations

import sys
import textwrap

import pytest

from assay.errors import UserError
from assay.models import ChatModel, GenerationParams, load_model, user_turn
from assay.models.python_backend import plain_prompt

FORMS = "hf:PATH"  # every spec error lists the accepted forms, starting with this one


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("gpt4", "has no backend prefix"),
        ("hf:", "has no backend prefix"),
        ("foo:bar", "unknown model backend 'foo'"),
        ("hf:/no/such/dir", "hf:/no/such/dir: no such file or directory"),
        ("vllm:/no/such/dir", "vllm:/no/such/dir: no such file or directory"),
        ("openai:localhost:8000", "is not an http(s) URL"),
        ("openai:ftp://host/v1", "is not an http(s) URL"),
        ("python:just_a_module", "needs python:MODULE:FUNCTION"),
    ],
)
def test_bad_specs_give_one_line_listing_the_forms(spec, fragment):
    with pytest.raises(UserError) as caught:
        load_model(spec)
    message = str(caught.value)
    assert fragment in message
    assert FORMS in message and "openai:BASE_URL" in message and "python:MODULE:FUNCTION" in message
    assert "\n" not in message


def test_hf_file_that_is_not_gguf(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"")
    with pytest.raises(UserError, match=r"not a \.gguf file"):
        load_model(f"hf:{weights}")


def test_openai_spec_needs_no_server_until_used():
    model = load_model("openai:http://127.0.0.1:9", model_name="m", concurrency=4, timeout=1.0, max_retries=0)
    assert model.model_id == "openai:http://127.0.0.1:9/v1#m"  # a bare host gets /v1
    assert model.concurrency == 4 and model.timeout == 1.0 and model.max_retries == 0
    assert load_model("openai:http://h:8000/v1/", model_name="x").base_url == "http://h:8000/v1"


def test_vllm_missing_is_a_user_error(tmp_path):
    if "vllm" in sys.modules or _importable("vllm"):
        pytest.skip("vllm is installed here")
    with pytest.raises(UserError, match=r"vllm is not installed; pip install 'assay\[vllm\]'"):
        load_model(f"vllm:{tmp_path}")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


RULES = textwrap.dedent(
    """
    CALLS = []

    def shout(prompts):
        CALLS.append(list(prompts))
        return [p.upper() for p in prompts]

    def with_params(prompts, params):
        return [f"{p}/{params.max_new_tokens}" for p in prompts]

    def too_few(prompts):
        return prompts[:-1]

    def not_strings(prompts):
        return [len(p) for p in prompts]

    def a_string(prompts):
        return "no"

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "rules.py"
    path.write_text(RULES, encoding="utf-8")
    return path


def test_python_backend_from_a_file(rules_file):
    model = load_model(f"python:{rules_file}:shout", batch_size=2)
    assert isinstance(model, ChatModel)
    conversations = [user_turn("a"), user_turn("b"), user_turn("c")]
    seen: dict[int, str] = {}
    assert model.chat(conversations, GenerationParams(), seen.__setitem__) == ["A", "B", "C"]
    assert seen == {0: "A", 1: "B", 2: "C"}
    assert model.function.__globals__["CALLS"] == [["a", "b"], ["c"]]  # batch_size prompts per call
    assert model.model_id.startswith(f"python:{rules_file}:shout@")


def test_python_backend_transcript_and_params(rules_file):
    conversation = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "v"},
    ]
    shout = load_model(f"python:{rules_file}:shout")
    assert shout.chat([conversation], GenerationParams()) == [
        "SYSTEM: S\nUSER: U\nASSISTANT: A\nUSER: V\nASSISTANT:"
    ]
    with_params = load_model(f"python:{rules_file}:with_params")
    assert with_params.chat([user_turn("q")], GenerationParams(max_new_tokens=5)) == ["q/5"]


def test_python_backend_from_a_dotted_module(tmp_path, monkeypatch):
    package = tmp_path / "rulepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rules.py").write_text(RULES, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = load_model("python:rulepkg.rules:shout")
    assert model.chat([user_turn("x")], GenerationParams()) == ["X"]


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        ("too_few", "returned 1 completions for 2 prompts"),
        ("not_strings", "returned a int at position 0; expected strings"),
        ("a_string", "returned str; expected a list of 2 strings"),
    ],
)
def test_python_backend_checks_what_the_function_returns(rules_file, function, fragment):
    model = load_model(f"python:{rules_file}:{function}")
    with pytest.raises(UserError, match=fragment):
        model.chat([user_turn("a"), user_turn("bb")], GenerationParams())


def test_python_backend_import_errors(rules_file, tmp_path):
    with pytest.raises(UserError, match="has no callable named 'missing'"):
        load_model(f"python:{rules_file}:missing")
    with pytest.raises(UserError, match="has no callable named 'NOT_CALLABLE'"):
        load_model(f"python:{rules_file}:NOT_CALLABLE")
    with pytest.raises(UserError, match="python model file not found"):
        load_model(f"python:{tmp_path / 'nope.py'}:f")
    with pytest.raises(UserError, match="module 'no_such_module_xyz' not found"):
        load_model("python:no_such_module_xyz:f")


def test_plain_prompt():
    assert plain_prompt(user_turn("just this")) == "just this"
    two = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert plain_prompt(two) == "User: q\nAssistant: a"
    assert (
        plain_prompt([{"role": "system", "content": "s"}, *user_turn("q")])
        == "System: s\nUser: q\nAssistant:"
    )
