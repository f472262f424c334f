"""The optional llama.cpp baselines: the worker protocol against a stand-in ``llama_cpp`` module, clear errors,
and (when llama-cpp-python is installed) greedy decoding of the embedded SmolLM2 GGUF."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

from specprim import bench
from specprim.bench import Decoding
from specprim.bench._llama_cpp import LlamaCppGenerate, llama_cpp_installed
from specprim.models import gguf_path

STAND_IN = '''
class Llama:
    """Stands in for llama_cpp.Llama: the continuation of ids is (last id + 1, last id + 2, ...)."""

    def __init__(self, model_path, n_ctx, n_threads, draft_model, use_extra_bufts, verbose):
        assert use_extra_bufts is False
        self.draft_model = draft_model

    def generate(self, tokens, **sampling):
        assert sampling["temp"] == 0.0 and sampling["reset"] is True
        token = tokens[-1]
        while True:
            token += 1
            yield token
'''


@pytest.fixture
def stand_in_llama(tmp_path, monkeypatch):
    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    (package / "llama_speculative.py").write_text(
        "class LlamaPromptLookupDecoding:\n    def __init__(self, num_pred_tokens):\n        self.n = num_pred_tokens\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    (tmp_path / "model.gguf").write_bytes(b"")
    return tmp_path / "model.gguf"


def test_the_worker_decodes_on_request_and_stops_at_eos_or_budget(stand_in_llama):
    method = LlamaCppGenerate(gguf=stand_in_llama, threads=1)
    out = method.generate(torch.tensor([[3, 4, 5]]), Decoding(max_new_tokens=4), seed=0)
    assert out.new_ids.tolist() == [6, 7, 8, 9] and out.stats is None
    out = method.generate(torch.tensor([[10]]), Decoding(max_new_tokens=9, eos_token_id=12), seed=0)
    assert out.new_ids.tolist() == [11, 12]  # the worker is reused and stops right after the EOS
    lookup = LlamaCppGenerate(gguf=stand_in_llama, threads=1, prompt_lookup=4)
    assert lookup.generate(torch.tensor([[1]]), Decoding(max_new_tokens=2), seed=0).new_ids.tolist() == [2, 3]
    with pytest.raises(ValueError, match="greedily"):
        method.generate(torch.tensor([[1]]), Decoding(max_new_tokens=2, temperature=1.0), seed=0)


def test_clear_errors(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="not a known model"):
        gguf_path("nope")
    context = bench.MethodContext(target=torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="known model's GGUF"):
        bench.build_method("llama-cpp", context)
    monkeypatch.setattr("specprim.bench._llama_cpp.llama_cpp_installed", lambda: False)
    with pytest.raises(ValueError, match="pip install llama-cpp-python"):
        LlamaCppGenerate(gguf=tmp_path / "x.gguf")
    assert "llama-cpp" in bench.method_names() and "llama-cpp-prompt-lookup" in bench.method_names()


@pytest.mark.real_model
@pytest.mark.skipif(not llama_cpp_installed(), reason="llama-cpp-python is not installed (optional, built from source)")
def test_llama_cpp_decodes_the_embedded_smollm2_gguf():
    from specprim import models

    _, tokenizer = models.load("smollm2-135m-instruct")
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    decoding = Decoding(max_new_tokens=12, eos_token_id=tokenizer.eos_token_id)
    plain = LlamaCppGenerate(gguf=gguf_path("smollm2-135m-instruct"), threads=2).generate(ids, decoding, 0)
    lookup = LlamaCppGenerate(gguf=gguf_path("smollm2-135m-instruct"), threads=2, prompt_lookup=4)
    assert len(plain.new_ids) > 0
    assert torch.equal(lookup.generate(ids, decoding, 0).new_ids, plain.new_ids)  # llama.cpp's lookup is lossless
    assert "paris" in tokenizer.decode(plain.new_ids).lower()
