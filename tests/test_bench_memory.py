"""The drafter's memory overhead in every bench JSON: ``drafter_state_bytes`` counts the tensors and arrays a method
holds beyond its draft modules' parameters and the target (draft KV cache, datastore arrays), each storage once;
``drafter_memory_bytes`` adds the parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _tiny import tiny_causal_lm
from test_bench import PROMPTS, word_tokenizer
from transformers import DynamicCache

from specprim import bench
from specprim.bench._memory import state_bytes
from specprim.drafters import Datastore


class Holder:
    """A drafter-like object holding state of every kind the count must sort."""

    def __init__(self, target: torch.nn.Module, head: torch.nn.Module) -> None:
        self.head = head  # parameters: counted as drafter_param_bytes, not here
        self.target_embedding = target.get_input_embeddings().weight  # the target's storage: not counted
        self.cache = DynamicCache()
        self.cache.update(torch.ones(1, 2, 5, 8), torch.ones(1, 2, 5, 8), layer_idx=0)  # 2 * 320 bytes
        self.features = [torch.ones(3, 4, dtype=torch.float64)]  # 96 bytes
        self.view = self.features[0][1:]  # a view of the same storage: not twice
        self.arrays = {"tokens": np.arange(10, dtype=np.int32), "more": np.zeros(6, dtype=np.int64)}  # 40 + 48
        self.array_view = self.arrays["tokens"][2:5]  # a view: not twice


def test_state_bytes_counts_each_storage_once_beyond_parameters_and_target():
    target = tiny_causal_lm("llama")
    head = torch.nn.Linear(8, 8)
    holder = Holder(target, head)
    assert state_bytes(holder, (head,), target) == 2 * 320 + 96 + 40 + 48
    assert state_bytes(holder, (head,), target, skip=(holder.cache,)) == 96 + 40 + 48


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    target, draft = tiny_causal_lm("llama"), tiny_causal_lm("llama", seed=1, layers=1)
    store = Datastore([[3, 4, 5, 3, 4, 6, 7], [4, 5, 6]])
    path = tmp_path_factory.mktemp("bench") / "out.json"
    bench.run(target=target, tokenizer=word_tokenizer(), draft=draft, datastore=store, prompts=PROMPTS[1:],
              methods=["prompt-lookup", "datastore", "leviathan"], max_new_tokens=6, num_draft=3, json_path=path)
    draft_bytes = sum(t.numel() * t.element_size() for t in (*draft.parameters(), *draft.buffers()))
    return json.loads(path.read_text()), store, draft_bytes


def test_every_bench_json_record_carries_the_drafter_memory_overhead(results):
    data, store, draft_bytes = results
    summaries = {s["method"]: s for s in data["results"]}
    for summary in summaries.values():
        assert summary["drafter_memory_bytes"] == summary["drafter_param_bytes"] + summary["drafter_state_bytes"]
    assert summaries["hf"]["drafter_memory_bytes"] == 0
    assert summaries["datastore"]["drafter_state_bytes"] >= store.tokens.nbytes  # the corpus arrays
    leviathan = summaries["leviathan"]
    assert leviathan["drafter_param_bytes"] == draft_bytes
    assert leviathan["drafter_state_bytes"] > 0  # the draft model's KV cache, kept between generations
