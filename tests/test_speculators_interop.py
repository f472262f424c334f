"""EAGLE-3 heads in the ``speculators`` format: the layout against a spec table, exact round trips and rejections
(always), and, when the ``speculators`` package is installed (``.ci/install_speculators``), the package's own
loader and draft forward on our exports, and our import of checkpoints the package wrote itself."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from safetensors.torch import load_file, save_file

from specprim.convert import export_eagle3, export_speculators, import_eagle, import_speculators
from specprim.drafters import EagleHead

LAYERS = 6
FEATURES = (1, 3, 5)
DRAFT_VOCAB = 24
# Draft logits of the package's forward and ours, both in float32: the same operations in another order.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
# 128 pairs: the package's flex-attention mask extends to a second drafting step only for multiples of 128.
LENGTH = 128
NEEDS_PACKAGE = "the speculators package is not installed (.ci/install_speculators installs it)"

# The documented layout (docs/export.md) for the tiny target: d=32, H=4, K=2, h=8, I=64, V=97, V_d=24.
SHAPES = {
    "fc.weight": (32, 96),
    "layers.0.input_layernorm.weight": (32,),
    "layers.0.hidden_norm.weight": (32,),
    "layers.0.self_attn.q_proj.weight": (32, 64),
    "layers.0.self_attn.k_proj.weight": (16, 64),
    "layers.0.self_attn.v_proj.weight": (16, 64),
    "layers.0.self_attn.o_proj.weight": (32, 32),
    "layers.0.post_attention_layernorm.weight": (32,),
    "layers.0.mlp.gate_proj.weight": (64, 32),
    "layers.0.mlp.up_proj.weight": (64, 32),
    "layers.0.mlp.down_proj.weight": (32, 64),
    "norm.weight": (32,),
    "lm_head.weight": (24, 32),
    "embed_tokens.weight": (97, 32),
    "d2t": (24,),
    "t2d": (97,),
}
CONFIG = {
    "speculators_model_type": "eagle3",
    "speculators_version": "0.9.0",
    "architectures": ["Eagle3DraftModel"],
    "draft_vocab_size": 24,
    "target_hidden_size": 32,
    "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
    "embed_requires_grad": False,
    "tie_word_embeddings": False,
    "speculators_config": {
        "algorithm": "eagle3",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": "tiny-llama", "architectures": []},
    },
}
LAYER_CONFIG = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "rms_norm_eps": 1e-6,
    "max_position_embeddings": 256, "vocab_size": 97, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", layers=LAYERS)


@pytest.fixture(scope="module")
def target_dir(target, tmp_path_factory):
    """The target saved locally: the verifier the package reads (config, layer count, LM head) when loading."""
    directory = tmp_path_factory.mktemp("target")
    target.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def package():
    return pytest.importorskip("speculators", reason=NEEDS_PACKAGE)


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


def sequence(length=LENGTH + 1):
    return torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def target_features(head, target, ids):
    """The head's three target features (each (1, T, d)) for the pairs of ``ids`` (T = length - 1)."""
    return head.select_features(target(ids[:, :-1], output_hidden_states=True).hidden_states)


@torch.no_grad()
def our_logits(head, target, ids):
    """(1, T, V_d) draft logits of every pair: feature ``t`` with token ``t + 1``."""
    return head(ids[:, 1:], head.fuse(target_features(head, target, ids))).draft_logits


@torch.no_grad()
def our_second_step(head, target, ids, t):
    """(V_d,) draft logits of the second drafting step after pair ``t``: the head's own predicted feature with
    the next token, attending to pairs ``0 .. t`` (a KV cache) and itself."""
    fused = head.fuse(target_features(head, target, ids))
    cache = head.new_cache()
    first = head(ids[:, 1 : t + 2], fused[:, : t + 1], cache=cache)
    return head(ids[:, t + 2 : t + 3], first.hidden[:, -1:], cache=cache).draft_logits[0, 0]


@torch.no_grad()
def package_logits(model, head, target, ids, steps=1):
    """The package's own draft forward (``Eagle3DraftModel.forward``) on the same target features: the draft
    logits of each of ``steps`` training-time-test steps, each (1, T, V_d), read from its LM head. Positions
    ``0 .. T - 1`` as ours (the package's default starts at 1: the same under RoPE up to rounding)."""
    features = torch.cat(target_features(head, target, ids), dim=-1)  # (1, T, 3d), the package's input
    length = features.shape[1]
    logits = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output))
    try:
        model(features, ids[:, 1:], torch.zeros(1, length, dtype=torch.long),
              position_ids=torch.arange(length)[None], ttt_steps=steps)
    finally:
        hook.remove()
    return logits


def load_package_model(package, directory):
    model = package.SpeculatorModel.from_pretrained(str(directory))
    assert type(model).__name__ == "Eagle3DraftModel"
    return model.eval()


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
    export_speculators(head, tmp_path, target_name_or_path="tiny-llama", dtype=dtype)
    config, weights = read(tmp_path)
    assert {name: tuple(t.shape) for name, t in weights.items()} == SHAPES
    state = head.state_dict()
    for name, tensor in weights.items():
        if name in ("d2t", "t2d"):
            continue
        ours = "hidden_norm.weight" if name == "layers.0.hidden_norm.weight" else name
        source = target.model.embed_tokens.weight if name == "embed_tokens.weight" else state[ours]
        assert tensor.dtype == dtype and torch.equal(tensor, source.detach().to(dtype)), name
    assert torch.equal(weights["d2t"], head.d2t - torch.arange(DRAFT_VOCAB))  # int64 offsets
    assert weights["t2d"].dtype == torch.bool and weights["t2d"].sum() == DRAFT_VOCAB and weights["t2d"][head.d2t].all()
    for key, value in CONFIG.items():
        assert config[key] == value, key
    layer = config["transformer_layer_config"]
    for key, value in LAYER_CONFIG.items():
        assert layer[key] == value, key
    assert config["dtype"] == layer["dtype"] == str(dtype).removeprefix("torch.")
    assert config["specprim"]["feature_layers"] == list(FEATURES)


def test_export_options_full_vocabulary_and_no_embedding(tmp_path, target):
    head = make_head(target, draft_vocab_size=VOCAB)
    export_speculators(head, tmp_path, include_embedding=False, speculative_tokens=5)
    config, weights = read(tmp_path)
    assert set(weights) == set(SHAPES) - {"d2t", "t2d", "embed_tokens.weight"}  # identity: no maps
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert config["speculators_config"]["verifier"]["name_or_path"] is None  # the tiny target has no name
    assert config["draft_vocab_size"] == VOCAB


# -------------------------------------------------------------------------------------------------- round trip
def test_round_trip_gives_an_identical_head(tmp_path, target):
    head = make_head(target)
    export_speculators(head, tmp_path, dtype=torch.float32)
    loaded = import_speculators(tmp_path, target)
    assert loaded.config == head.config and torch.equal(loaded.d2t, head.d2t)
    theirs, ours = loaded.state_dict(), head.state_dict()
    assert set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
    ids = sequence(9)
    assert torch.equal(our_logits(loaded, target, ids), our_logits(head, target, ids))


def test_bf16_round_trip_gives_the_rounded_head(tmp_path, target):
    head = make_head(target, draft_vocab_size=VOCAB)
    export_speculators(head, tmp_path)  # bfloat16, full vocabulary (no d2t / t2d)
    loaded = import_speculators(tmp_path, target)
    for name, tensor in head.state_dict().items():
        expected = tensor if name == "d2t" else tensor.to(torch.bfloat16).float()
        assert torch.equal(loaded.state_dict()[name], expected), name


def test_the_two_formats_hold_the_same_head(tmp_path, target):
    head = make_head(target)
    export_speculators(head, tmp_path / "speculators", dtype=torch.float32)
    export_eagle3(import_speculators(tmp_path / "speculators", target), tmp_path / "engine", dtype=torch.float32)
    again = import_eagle(tmp_path / "engine", target)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in head.state_dict().items())


# --------------------------------------------------------------------------------------------------- rejections
def _drop(key):
    return lambda config, weights: config.pop(key)


def _set(key, value):
    return lambda config, weights: config.__setitem__(key, value)


def _layer(key, value):
    return lambda config, weights: config["transformer_layer_config"].__setitem__(key, value)


def _second_layer(config, weights):
    config["transformer_layer_config"]["num_hidden_layers"] = 2
    for name in [n for n in weights if n.startswith("layers.0.") and "hidden_norm" not in n]:
        weights[name.replace("layers.0.", "layers.1.")] = weights[name].clone()


REJECTIONS = {
    "not-speculators": (_drop("speculators_model_type"), "import_eagle"),
    "other-algorithm": (_set("speculators_model_type", "mtp"), "speculators 'mtp' model"),
    "bad-settings": (_set("speculators_config", [1]), "speculators_config must be a JSON object"),
    "qwen3-layer": (_layer("model_type", "qwen3"), "model_type is 'qwen3'"),
    "default-layer": (lambda c, w: c["transformer_layer_config"].pop("model_type"), "model_type is 'qwen3'"),
    "ambiguous-residual": (_drop("norm_before_residual"), "ambiguous"),
    "norm-before-residual": (_set("norm_before_residual", True), "norm_before_residual"),
    "norm-before-fc": (_set("norm_before_fc", True), "sets norm_before_fc"),
    "fc-norm": (_set("fc_norm", True), "sets fc_norm"),
    "norm-output": (_set("norm_output", True), "sets norm_output"),
    "two-layers": (_second_layer, "only one-layer"),
    "other-embedding": (lambda c, w: w.__setitem__("embed_tokens.weight", torch.randn(VOCAB, 32)),
                        "differs from the target"),
    "t2d": (lambda c, w: w.__setitem__("t2d", ~w["t2d"]), "not the target mask"),
    "missing-tensor": (lambda c, w: w.pop("layers.0.mlp.up_proj.weight"), "no tensor for midlayer.mlp.up_proj"),
}


@pytest.mark.parametrize("rejection", list(REJECTIONS))
def test_import_rejects_what_an_eagle_head_cannot_compute(tmp_path, target, rejection):
    export_speculators(make_head(target), tmp_path / "a")
    config, weights = read(tmp_path / "a")
    edit, match = REJECTIONS[rejection]
    edit(config, weights)
    write(tmp_path / "b", config, weights)
    with pytest.raises(ValueError, match=match):
        import_speculators(tmp_path / "b", target)


def test_import_rejects_another_target_and_each_loader_names_the_other(tmp_path, target):
    export_speculators(make_head(target), tmp_path / "speculators")
    with pytest.raises(ValueError, match="vocab_size=97, but LlamaForCausalLM has vocab_size=120"):
        import_speculators(tmp_path / "speculators", tiny_causal_lm("llama", vocab=120, layers=LAYERS))
    with pytest.raises(ValueError, match="load it with import_speculators"):
        import_eagle(tmp_path / "speculators", target)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        import_speculators(tmp_path / "missing", target)


@pytest.mark.parametrize(
    "make,options,match",
    [
        (lambda t: make_head(t), dict(speculative_tokens=0), "speculative_tokens must be a positive int"),
        (lambda t: make_head(t), dict(dtype=torch.int32), "floating-point"),
        (lambda t: EagleHead.from_target(t, version=1), {}, "only EAGLE-3 heads"),
        (lambda t: make_head(t, feature_layers=(1, 3)), {}, "exactly 3 target features"),
    ],
    ids=["tokens", "dtype", "eagle1", "two-features"],
)
def test_export_rejects_bad_arguments_and_heads_the_format_cannot_hold(tmp_path, target, make, options, match):
    with pytest.raises(ValueError, match=match):
        export_speculators(make(target), tmp_path, **options)


# ------------------------------------------------------------------------------------ the speculators package
def test_the_package_loads_our_export_and_drafts_our_logits(tmp_path, target, target_dir, package):
    """The package's ``SpeculatorModel.from_pretrained`` and ``Eagle3DraftModel.forward`` (its defaults: flex
    attention, the verifier read from ``target_dir``) on our fp32 export: both training-time-test steps give
    our draft logits, the first for every pair and the second as our KV-cached drafting step."""
    head = make_head(target)
    export_speculators(head, tmp_path, target_name_or_path=target_dir, dtype=torch.float32)
    model = load_package_model(package, tmp_path)
    assert model.dtype == torch.float32 and model.config.eagle_aux_hidden_state_layer_ids == list(FEATURES)
    ids = sequence()
    first, second = package_logits(model, head, target, ids, steps=2)
    torch.testing.assert_close(first, our_logits(head, target, ids), **TOLERANCE)
    for t in (0, 1, 40, LENGTH - 2):  # the package pads the last pair's next token: no second step to compare
        torch.testing.assert_close(second[0, t], our_second_step(head, target, ids, t), **TOLERANCE)


def test_the_package_reads_our_draft_vocabulary(tmp_path, target, target_dir, package):
    head = make_head(target)
    export_speculators(head, tmp_path, target_name_or_path=target_dir, dtype=torch.float32)
    model = load_package_model(package, tmp_path)
    assert torch.equal(model.d2t + torch.arange(DRAFT_VOCAB), head.d2t)  # draft id -> target id
    assert torch.equal(model.t2d, torch.isin(torch.arange(VOCAB), head.d2t))
    # the package's training targets: the verifier's LM-head rows it selects with t2d, in draft-id order
    assert torch.equal(model.verifier_lm_head.weight, target.lm_head.weight[head.d2t])


def _swap(first, second):
    def edit(weights):
        weights[first], weights[second] = weights[second], weights[first]
    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _swap("layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight"),
        _swap("layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"),
    ],
    ids=["norms", "gate-up"],
)
def test_the_comparison_fails_for_a_broken_export(tmp_path, target, target_dir, package, edit):
    head = make_head(target)
    export_speculators(head, tmp_path / "a", target_name_or_path=target_dir, dtype=torch.float32)
    config, weights = read(tmp_path / "a")
    edit(weights)
    write(tmp_path / "b", config, weights)
    ids = sequence(9)
    (theirs,) = package_logits(load_package_model(package, tmp_path / "b"), head, target, ids)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(theirs, our_logits(head, target, ids), **TOLERANCE)


def test_the_package_validates_our_config(tmp_path, target, package):
    export_speculators(make_head(target), tmp_path, target_name_or_path="tiny-llama")
    config, _ = read(tmp_path)
    parsed = package.SpeculatorModelConfig.from_dict(config)  # its pydantic schema and validators
    assert type(parsed) is package.Eagle3SpeculatorConfig
    assert parsed.transformer_layer_config.model_type == "llama" and parsed.target_vocab_size == VOCAB
    dumped = parsed.to_dict()
    for key in CONFIG:
        assert dumped[key] == config[key], key


def test_we_import_a_checkpoint_the_package_wrote(tmp_path, target, target_dir, package):
    """A head born in the package (its config classes, random weights, ``save_pretrained``) imports into an
    ``EagleHead`` that drafts the package's logits."""
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config = package.Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, eagle_aux_hidden_state_layer_ids=[2, 3, 4],
        speculators_config=package.SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy", verifier=package.VerifierConfig.from_pretrained(target_dir),
        ),
    )
    model = package.Eagle3DraftModel(config)
    target_ids = torch.tensor(sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(2))[:DRAFT_VOCAB]))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.1 * torch.randn(param.shape, generator=generator) + (1.0 if param.dim() == 1 else 0.0))
        model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    model.load_vocab_mappings(torch.isin(torch.arange(VOCAB), target_ids), target_ids - torch.arange(DRAFT_VOCAB))
    model.save_pretrained(tmp_path)
    head = import_speculators(tmp_path, target)
    assert head.config.feature_layers == (2, 3, 4) and torch.equal(head.d2t, target_ids)
    ids = sequence(9)
    (theirs,) = package_logits(load_package_model(package, tmp_path), head, target, ids)
    torch.testing.assert_close(theirs, our_logits(head, target, ids), **TOLERANCE)
