"""EAGLE-3 heads in the vLLM / SGLang checkpoint layout: the export against an explicit spec table, the auxiliary
layer ids against the target's actual residual stream in each engine's convention, exact round trips, rejected
targets and corrupted checkpoints, and lossless drafting with an imported head."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specprim import presets
from specprim.convert import export_eagle3, import_eagle
from specprim.drafters import EagleHead
from specprim.drafters._vocab import count_tokens, target_to_draft
from specprim.trees import Chain, DynamicTree

LAYERS = 6
FEATURES = (1, 3, 5)  # output_hidden_states indices of the 6-layer target
DRAFT_VOCAB = 24
PROMPT = torch.tensor([[5, 17, 33, 8, 61, 2, 40, 9]])

# The documented layout (docs/export.md) for the tiny target: d=32, H=4, K=2, h=8, I=64, V=97, V_d=24.
# engine name: (shape, "float" | dtype, EagleHead state-dict name)
SPEC = {
    "fc.weight": ((32, 96), "float", "fc.weight"),
    "midlayer.input_layernorm.weight": ((32,), "float", "layers.0.input_layernorm.weight"),
    "midlayer.hidden_norm.weight": ((32,), "float", "hidden_norm.weight"),
    "midlayer.self_attn.q_proj.weight": ((32, 64), "float", "layers.0.self_attn.q_proj.weight"),
    "midlayer.self_attn.k_proj.weight": ((16, 64), "float", "layers.0.self_attn.k_proj.weight"),
    "midlayer.self_attn.v_proj.weight": ((16, 64), "float", "layers.0.self_attn.v_proj.weight"),
    "midlayer.self_attn.o_proj.weight": ((32, 32), "float", "layers.0.self_attn.o_proj.weight"),
    "midlayer.post_attention_layernorm.weight": ((32,), "float", "layers.0.post_attention_layernorm.weight"),
    "midlayer.mlp.gate_proj.weight": ((64, 32), "float", "layers.0.mlp.gate_proj.weight"),
    "midlayer.mlp.up_proj.weight": ((64, 32), "float", "layers.0.mlp.up_proj.weight"),
    "midlayer.mlp.down_proj.weight": ((32, 64), "float", "layers.0.mlp.down_proj.weight"),
    "norm.weight": ((32,), "float", "norm.weight"),
    "lm_head.weight": ((24, 32), "float", "lm_head.weight"),
    "d2t": ((24,), torch.int64, None),
    "t2d": ((97,), torch.bool, None),
}
CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "vocab_size": 97,
    "draft_vocab_size": 24,
    "target_hidden_size": 32,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "norm_before_residual": False,
    "eagle_aux_hidden_state_layer_ids": [1, 3, 5],  # vLLM: the stream entering decoder layer j
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True},  # SGLang: output
}


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", layers=LAYERS)


def make_head(target, seed=0, **kwargs) -> EagleHead:
    """A head over a non-prefix draft vocabulary with every tensor random (norms too), so a swapped name shows."""
    counts = torch.arange(VOCAB).flip(0)
    counts[50:60] = 1000  # some large ids are among the most frequent
    options = dict(version=3, draft_vocab_size=DRAFT_VOCAB, token_counts=counts, feature_layers=FEATURES)
    head = EagleHead.from_target(target, **{**options, **kwargs})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in head.parameters():
            noise = 0.1 * torch.randn(param.shape, generator=generator)
            param.copy_(noise + 1.0 if param.dim() == 1 else noise)
    return head


def hf_greedy(target, prompt, max_new_tokens):
    return target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )


@torch.no_grad()
def outputs(head, target, ids=PROMPT):
    """The head's predicted features (1, T - 1, d) and target-vocabulary logits on the target's features of ``ids``."""
    hidden_states = target(ids[:, :-1], output_hidden_states=True).hidden_states
    out = head(ids[:, 1:], head.fuse(head.select_features(hidden_states)))
    return out.hidden, head.logits(out.hidden)


def read(directory):
    with open(directory / "config.json") as f:
        return json.load(f), load_file(directory / "model.safetensors")


def write(directory, config, weights):
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file(weights, directory / "model.safetensors")


# ------------------------------------------------------------------------------------------------------ layout
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_export_matches_the_spec_table(tmp_path, target, dtype):
    head = make_head(target)
    export_eagle3(head, tmp_path, dtype=dtype)
    config, weights = read(tmp_path)
    assert set(weights) == set(SPEC)
    state = head.state_dict()
    for name, (shape, kind, head_name) in SPEC.items():
        tensor = weights[name]
        assert tuple(tensor.shape) == shape, name
        assert tensor.dtype == (dtype if kind == "float" else kind), name
        if head_name is not None:
            assert torch.equal(tensor, state[head_name].to(dtype)), name
    d2t = head.d2t
    assert torch.equal(weights["d2t"], d2t - torch.arange(DRAFT_VOCAB))  # offsets target_id - draft_id
    assert weights["t2d"].sum() == DRAFT_VOCAB and weights["t2d"][d2t].all()
    for key, value in CONFIG.items():
        assert config[key] == value, key
    assert config["torch_dtype"] == str(dtype).removeprefix("torch.")
    assert config["specprim"]["target_num_hidden_layers"] == LAYERS
    parsed = LlamaConfig.from_dict(config)  # how a transformers-based engine reads it
    assert parsed.rope_parameters == head.layer_config.rope_parameters
    assert (parsed.head_dim, parsed.num_key_value_heads) == (8, 2)


def _record_input(store, index):
    def hook(module, args, kwargs):
        store[index] = (args[0] if args else kwargs["hidden_states"]).clone()
    return hook


def _record_output(store, index):
    def hook(module, args, output):
        store[index] = (output[0] if isinstance(output, tuple) else output).clone()
    return hook


def test_aux_layer_ids_name_the_heads_features_in_each_engines_convention(tmp_path, target):
    """vLLM captures the residual stream entering decoder layer ``j``; SGLang (after adding 1 to the config id)
    the stream entering layer ``j + 1``, i.e. the output of layer ``j``. Both must be the head's features."""
    head = make_head(target)
    export_eagle3(head, tmp_path)
    config, _ = read(tmp_path)
    entering, leaving = {}, {}
    handles = []
    for j, layer in enumerate(target.model.layers):
        handles.append(layer.register_forward_pre_hook(_record_input(entering, j), with_kwargs=True))
        handles.append(layer.register_forward_hook(_record_output(leaving, j)))
    try:
        with torch.no_grad():
            hidden_states = target(PROMPT, output_hidden_states=True).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    features = head.select_features(hidden_states)
    vllm = [entering[j] for j in config["eagle_aux_hidden_state_layer_ids"]]
    sglang = [leaving[j] for j in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    assert len(features) == len(vllm) == len(sglang) == 3
    for feature, a, b in zip(features, vllm, sglang, strict=True):
        assert torch.equal(feature, a) and torch.equal(feature, b)


# -------------------------------------------------------------------------------------------------- round trip
def test_round_trip_gives_an_identical_head(tmp_path, target):
    head = make_head(target)
    export_eagle3(head, tmp_path, dtype=torch.float32, target_name_or_path="tiny-llama")
    loaded = import_eagle(tmp_path, target)
    assert loaded.config == head.config and torch.equal(loaded.d2t, head.d2t)
    assert torch.equal(loaded.rotary_emb.inv_freq, head.rotary_emb.inv_freq)
    theirs, ours = loaded.state_dict(), head.state_dict()
    assert set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
    for a, b in zip(outputs(loaded, target), outputs(head, target), strict=True):
        assert torch.equal(a, b)
    assert read(tmp_path)[0]["specprim"]["target_name_or_path"] == "tiny-llama"


def test_bf16_round_trip_gives_the_rounded_head(tmp_path, target):
    head = make_head(target)
    export_eagle3(head, tmp_path)  # bfloat16 by default
    loaded = import_eagle(tmp_path, target)
    assert loaded.fc.weight.dtype == torch.float32  # cast to the target's dtype
    for name, tensor in head.state_dict().items():
        expected = tensor if name == "d2t" else tensor.to(torch.bfloat16).float()
        assert torch.equal(loaded.state_dict()[name], expected), name


def test_round_trip_on_a_qwen2_target_with_zero_biases(tmp_path):
    target = tiny_causal_lm("qwen2", layers=LAYERS)
    head = make_head(target)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith(".bias"):
                param.zero_()  # the engines' Llama layer has no biases
    export_eagle3(head, tmp_path, dtype=torch.float32)
    assert set(read(tmp_path)[1]) == set(SPEC)
    loaded = import_eagle(tmp_path, target)
    for a, b in zip(outputs(loaded, target), outputs(head, target), strict=True):
        assert torch.equal(a, b)


def test_import_sorts_an_unsorted_draft_vocabulary(tmp_path, target):
    head = make_head(target)
    export_eagle3(head, tmp_path / "sorted", dtype=torch.float32)
    config, weights = read(tmp_path / "sorted")
    perm = torch.randperm(DRAFT_VOCAB, generator=torch.Generator().manual_seed(1))
    target_ids = head.d2t[perm]  # draft id i now means target id d2t[perm[i]]
    weights["d2t"] = target_ids - torch.arange(DRAFT_VOCAB)
    weights["lm_head.weight"] = weights["lm_head.weight"][perm].contiguous()
    write(tmp_path / "shuffled", config, weights)
    loaded = import_eagle(tmp_path / "shuffled", target)
    assert torch.equal(loaded.d2t, head.d2t)
    torch.testing.assert_close(outputs(loaded, target)[1], outputs(head, target)[1], rtol=0, atol=1e-6)


def test_import_builds_the_checkpoints_rotary_embedding(tmp_path, target):
    """Engines build the draft's rotary embedding from the draft config, which may differ from the target's."""
    export_eagle3(make_head(target), tmp_path / "a", dtype=torch.float32)
    config, weights = read(tmp_path / "a")
    for key in ("rope_parameters", "rope_scaling"):
        del config[key]
    config["rope_theta"] = 500000.0
    write(tmp_path / "b", config, weights)
    loaded = import_eagle(tmp_path / "b", target)
    expected = LlamaRotaryEmbedding(LlamaConfig(hidden_size=32, num_attention_heads=4, rope_theta=500000.0))
    assert torch.equal(loaded.rotary_emb.inv_freq, expected.inv_freq)
    assert not torch.equal(loaded.rotary_emb.inv_freq, target.model.rotary_emb.inv_freq)
    export_eagle3(loaded, tmp_path / "c", dtype=torch.float32)  # the override is exported ...
    assert read(tmp_path / "c")[0]["rope_theta"] == 500000.0
    again = import_eagle(tmp_path / "c", target)  # ... and imported again
    for a, b in zip(outputs(again, target), outputs(loaded, target), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "edit,features",
    [
        (lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), FEATURES),  # SGLang ids only: + 1
        (lambda c: c.pop("eagle_config"), FEATURES),  # vLLM ids only: as is
        (lambda c: (c.pop("eagle_config"), c.pop("eagle_aux_hidden_state_layer_ids"), c.pop("specprim")),
         (2, LAYERS // 2, LAYERS - 3)),  # no ids: both engines' default
    ],
    ids=["sglang-ids", "vllm-ids", "default"],
)
def test_import_reads_either_engines_layer_ids(tmp_path, target, edit, features):
    export_eagle3(make_head(target), tmp_path / "a")
    config, weights = read(tmp_path / "a")
    edit(config)
    write(tmp_path / "b", config, weights)
    assert import_eagle(tmp_path / "b", target).config.feature_layers == features


def test_import_takes_a_missing_full_vocabulary_lm_head_from_the_target(tmp_path, target):
    head = make_head(target, draft_vocab_size=VOCAB)
    export_eagle3(head, tmp_path / "a", dtype=torch.float32)
    config, weights = read(tmp_path / "a")
    del weights["lm_head.weight"], weights["d2t"], weights["t2d"]
    write(tmp_path / "b", config, weights)
    loaded = import_eagle(tmp_path / "b", target)
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight)


# --------------------------------------------------------------------------------------------------- rejections
def _llama(**overrides):
    torch.manual_seed(0)
    options = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(LlamaConfig(**{**options, **overrides})).eval()


@pytest.mark.parametrize(
    "make_target,match",
    [
        (lambda: _llama(hidden_size=48), "hidden_size=32, but LlamaForCausalLM has hidden_size=48"),
        (lambda: _llama(vocab_size=120), "vocab_size=97, but LlamaForCausalLM has vocab_size=120"),
        (lambda: _llama(num_hidden_layers=8), "exported for a 6-layer target"),
        (lambda: _llama(intermediate_size=48), "intermediate_size: checkpoint 64, target layer 48"),
        (lambda: _llama(rms_norm_eps=1e-5), "rms_norm_eps"),
    ],
    ids=["hidden", "vocab", "depth", "mlp", "eps"],
)
def test_import_rejects_a_mismatched_target(tmp_path, target, make_target, match):
    export_eagle3(make_head(target), tmp_path)
    with pytest.raises(ValueError, match=match):
        import_eagle(tmp_path, make_target())


def _eagle1(config, weights):
    """The EAGLE-1 layout: ``layers.0.*`` without input_layernorm, fc over cat(embedding, feature)."""
    for name in list(weights):
        if name.startswith("midlayer."):
            tensor = weights.pop(name)
            if "input_layernorm" not in name and "hidden_norm" not in name:
                weights[name.replace("midlayer.", "layers.0.")] = tensor
    weights["fc.weight"] = weights["fc.weight"][:, :64].contiguous()
    config["architectures"] = ["EagleLlamaForCausalLM"]


def _set(key, value):
    return lambda config, weights: config.__setitem__(key, value)


def _put(name, make):
    return lambda config, weights: weights.__setitem__(name, make(weights))


CORRUPTIONS = {
    "unknown-tensor": (_put("midlayer.extra.weight", lambda w: torch.zeros(32)), "no EagleHead counterpart"),
    "missing-tensor": (lambda c, w: w.pop("midlayer.mlp.up_proj.weight"), "no tensor for midlayer.mlp.up_proj"),
    "wrong-shape": (_put("fc.weight", lambda w: w["fc.weight"][:, :64].contiguous()), "fc.weight has shape"),
    "t2d": (_put("t2d", lambda w: ~w["t2d"]), "t2d .* is not the target mask of d2t"),
    "d2t-duplicate": (_put("d2t", lambda w: torch.cat([w["d2t"][:1], w["d2t"][:1] - 1, w["d2t"][2:]])),
                      "not a valid draft vocabulary"),
    "d2t-out-of-range": (_put("d2t", lambda w: w["d2t"] + VOCAB), "not a valid draft vocabulary"),
    "two-layers": (_set("num_hidden_layers", 2), "only one-layer"),
    "norm-before-residual": (_set("norm_before_residual", True), "norm_before_residual"),
    "inconsistent-ids": (_set("eagle_config", {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}),
                         "name different layers"),
    "id-out-of-range": (lambda c, w: (c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 6]), c.pop("eagle_config"),
                                      c.pop("specprim")), "must be three indices"),
    "geometry": (lambda c, w: c.update(num_attention_heads=8, head_dim=4), "num_attention_heads: checkpoint 8"),
    "other-embedding": (_put("embed_tokens.weight", lambda w: torch.randn(VOCAB, 32)), "differs from the target"),
    "eagle1": (_eagle1, "holds an EAGLE-1 head"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_import_rejects_a_corrupted_checkpoint(tmp_path, target, corruption):
    export_eagle3(make_head(target), tmp_path / "a")
    config, weights = read(tmp_path / "a")
    corrupt, match = CORRUPTIONS[corruption]
    corrupt(config, weights)
    write(tmp_path / "b", config, weights)
    with pytest.raises(ValueError, match=match):
        import_eagle(tmp_path / "b", target)


def test_import_accepts_the_targets_own_embedding_and_needs_files(tmp_path, target):
    export_eagle3(make_head(target), tmp_path / "a")
    config, weights = read(tmp_path / "a")
    weights["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().to(torch.bfloat16)
    write(tmp_path / "b", config, weights)
    import_eagle(tmp_path / "b", target)
    (tmp_path / "b" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        import_eagle(tmp_path / "b", target)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        import_eagle(tmp_path / "missing", target)
    make_head(target).save_pretrained(tmp_path / "native")  # specprim's own format has its own loader
    with pytest.raises(ValueError, match="load it with EagleHead.from_pretrained"):
        import_eagle(tmp_path / "native", target)


def _qwen3():
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
    )).eval()


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda t: EagleHead.from_target(t, version=1), "only EAGLE-3 heads"),
        (lambda t: EagleHead.from_target(t, version=3, feature_layers=FEATURES, num_layers=2), "only one-layer"),
        (lambda t: EagleHead.from_target(t, version=3, feature_layers=(1, 3)), "exactly 3 target features"),
        (lambda t: EagleHead.from_target(t, version=3, feature_layers=(0, 3, 5)), r"feature layers \[0\]"),
        (lambda t: EagleHead.from_target(t, version=3, feature_layers=(1, 3, -1)), r"feature layers \[-1\]"),
        (lambda t: EagleHead.from_target(t, version=3, feature_layers=(1, 3, 6)), r"feature layers \[6\]"),
        (lambda t: EagleHead.from_target(_qwen3(), version=3, feature_layers=FEATURES), "q_norm"),
        (lambda t: make_head(tiny_causal_lm("qwen2", layers=LAYERS)), "q_proj.bias"),  # non-zero biases
    ],
    ids=["eagle1", "two-layers", "two-features", "embeddings", "last", "out-of-range", "qwen3", "qwen2-bias"],
)
def test_export_rejects_heads_the_engines_cannot_load(tmp_path, target, make, match):
    with pytest.raises(ValueError, match=match):
        export_eagle3(make(target), tmp_path)


def test_export_rejects_a_non_float_dtype(tmp_path, target):
    with pytest.raises(ValueError, match="floating-point"):
        export_eagle3(make_head(target), tmp_path, dtype=torch.int32)


# ------------------------------------------------------------------------------------------------- drafting
@pytest.fixture(scope="module")
def trained(target):
    """A head trained ~1 s on the target's own greedy text, and one of its prompts: drafts get accepted there and
    several tokens commit per step."""
    target.requires_grad_(False)
    prompts = torch.randint(2, VOCAB, (16, 4), generator=torch.Generator().manual_seed(0))
    data = hf_greedy(target, prompts, 40)  # (16, 44)
    head = EagleHead.from_target(target, version=3, draft_vocab_size=64, token_counts=count_tokens([data], VOCAB),
                                 feature_layers=FEATURES, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(data, output_hidden_states=True)
    hidden = head.fuse(head.select_features(out.hidden_states)).detach()[:, :-1]
    labels = target_to_draft(head.d2t, VOCAB)[out.logits.argmax(-1)[:, 1:]]
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(100):
        logits = head(data[:, 1:], hidden).draft_logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.requires_grad_(False), prompts[:1]


@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(depth=4, top_k=4, budget=16)], ids=["chain4", "dynamic"])
def test_imported_head_drafts_losslessly_and_like_the_original(tmp_path, target, trained, tree):
    trained, prompt = trained
    expected = hf_greedy(target, prompt, 40)
    original = presets.eagle3(trained, tree).generate(target, prompt, max_new_tokens=40)
    export_eagle3(trained, tmp_path / "fp32", dtype=torch.float32)
    imported = presets.eagle3(import_eagle(tmp_path / "fp32", target), tree).generate(target, prompt,
                                                                                      max_new_tokens=40)
    assert torch.equal(original.sequences, expected) and torch.equal(imported.sequences, expected)
    assert imported.stats.tau == original.stats.tau > 1.3  # the same drafts accepted: the same head
    export_eagle3(trained, tmp_path / "bf16")
    rounded = presets.eagle3(import_eagle(tmp_path / "bf16", target), tree).generate(target, prompt,
                                                                                     max_new_tokens=40)
    assert torch.equal(rounded.sequences, expected)
