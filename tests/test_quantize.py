"""Weight-only int8 quantization: the quantized linear against a de-quantized reference, row independence,
speculative decoding lossless with respect to the quantized target (greedy parity and a sampling chi-square),
the quantization really changes the model, and clear errors for bad input."""

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from torch import nn

from specprim import DraftTree, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.cli import chat_input_ids
from specprim.drafters import EagleHead, ModelDrafter, PromptLookup, eagle_drafter
from specprim.hf import HFTarget
from specprim.models import Int8Linear, load, quantize_weights
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree


def reference(model, prompt, max_new_tokens, eos_token_id=1):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos_token_id, pad_token_id=0)


def quantized(arch="llama", seed=0, **kwargs):
    return quantize_weights(tiny_causal_lm(arch, seed=seed, **kwargs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_matches_dequantized_matmul(dtype, bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias).to(dtype)
    layer = Int8Linear.from_linear(linear)
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_int8.abs().max() == 127
    assert layer.scale.dtype == dtype
    expected_scale = linear.weight.float().abs().amax(dim=1) / 127
    torch.testing.assert_close(layer.scale.float(), expected_scale, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               atol=0)
    dequantized = layer.weight_int8.double() * layer.scale.double()[:, None]
    assert (dequantized - linear.weight.double()).abs().max() <= layer.scale.double().max() * 0.51
    x = torch.randn(2, 5, 64).to(dtype)
    want = x.double() @ dequantized.T + (linear.bias.double() if bias else 0)
    got = layer(x)
    assert got.shape == (2, 5, 48) and got.dtype == dtype
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), want, **tolerance)
    torch.testing.assert_close(layer.weight, dequantized.to(dtype))


def test_quantize_weights_replaces_linears_but_not_head_or_embeddings():
    model = tiny_causal_lm("llama")
    embeddings = model.get_input_embeddings().weight.clone()
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert quantize_weights(model) is model
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == linears - 1
    assert type(model.get_output_embeddings()) is nn.Linear
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    with_head = quantize_weights(tiny_causal_lm("llama"), include_lm_head=True)
    assert isinstance(with_head.get_output_embeddings(), Int8Linear)
    assert not any(isinstance(m, nn.Linear) for m in with_head.modules())
    tied = tiny_causal_lm("gemma3")
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    tied_embeddings = tied.get_input_embeddings().weight.clone()
    quantize_weights(tied, "int8-all")  # the scheme's name for include_lm_head=True
    assert isinstance(tied.get_output_embeddings(), Int8Linear)
    assert not any(isinstance(m, nn.Linear) for m in tied.modules())
    assert torch.equal(tied.get_input_embeddings().weight, tied_embeddings)  # the embeddings stay floating point


def _scores(model, prompt, tokens, parents):
    """Target logits (N + 1, V) of ``[root] + tree`` for the tree ``tokens`` (N,) / ``parents`` (N,)."""
    target = HFTarget(model)
    target.start(prompt)
    tree = DraftTree(tokens=torch.tensor([tokens], dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long),
                     sampling="deterministic")
    return target.verify(prompt[:, -1], tree)[0][0]


def test_rows_are_independent():
    """A token's logits scored alone equal its logits inside a 16-token tree forward (fp32, summation-order noise)."""
    model = quantize_weights(tiny_causal_lm("llama"), include_lm_head=True)
    prompt = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    parents = [-1, -1, 0, 0, 1, 2, 2, 3, 4, 5, 6, 6, 7, 9, 11]
    tokens = torch.randint(2, VOCAB, (15,), generator=torch.Generator().manual_seed(1)).tolist()
    tree = _scores(model, prompt, tokens, parents)  # (16, V)
    alone = _scores(model, prompt, [], [])  # the root scored alone: one row
    scale = alone.abs().max().item()
    torch.testing.assert_close(tree[0], alone[0], rtol=1e-5, atol=1e-5 * scale)
    for node in (6, 13, 14):  # a node scored on its own ancestor path (a chain) agrees with its row in the tree
        path, at = [], node
        while at != -1:
            path.insert(0, at)
            at = parents[at]
        chain = _scores(model, prompt, [tokens[i] for i in path], list(range(-1, len(path) - 1)))
        torch.testing.assert_close(tree[node + 1], chain[-1], rtol=1e-5, atol=1e-5 * scale)
    layer = Int8Linear.from_linear(nn.Linear(32, 16))
    rows = torch.randn(16, 32)
    rows[5:] *= 100  # large rows elsewhere in the batch do not change row 0 (no per-batch activation scale)
    torch.testing.assert_close(layer(rows)[:1], layer(rows[:1]), rtol=1e-5, atol=1e-6)


def test_quantization_changes_the_model():
    plain, quant = tiny_causal_lm("llama"), quantized()
    prompt = torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (plain(prompt).logits - quant(prompt).logits).abs().max()
    assert difference > 1e-4  # far above fp32 noise
    prompts = [torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    assert any(not torch.equal(reference(plain, p, 40), reference(quant, p, 40)) for p in prompts)


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "quantized-draft-chain", "quantized-draft-tree",
                                          "unquantized-draft-chain", "eagle3-head", "eagle3-head, int8-all target"])
def test_greedy_speculation_matches_the_quantized_target(drafter_name):
    target = quantize_weights(tiny_causal_lm("llama", seed=0), "int8-all" if "int8-all" in drafter_name else "int8")
    drafters = {
        "prompt-lookup": lambda: PromptLookup(num_tokens=6),
        "quantized-draft-chain": lambda: ModelDrafter(quantized(seed=1), Chain(3)),
        "quantized-draft-tree": lambda: ModelDrafter(quantized(seed=1), DynamicTree(depth=3, top_k=2, budget=6)),
        "unquantized-draft-chain": lambda: ModelDrafter(tiny_causal_lm("llama", seed=0), Chain(4)),
        "eagle3-head": lambda: eagle_drafter(EagleHead.from_target(target, version=3, draft_vocab_size=VOCAB // 2),
                                             DynamicTree(depth=3, top_k=2, budget=6)),
    }
    drafters["eagle3-head, int8-all target"] = drafters["eagle3-head"]
    pattern = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    for prompt in (torch.cat([pattern, pattern, pattern[:, :4]], dim=1), pattern[:, :7]):
        expected = reference(target, prompt, 40)
        for rule in (Greedy(), SpeculativeSampling()):
            out = speculative_generate(target, prompt, drafter=drafters[drafter_name](), acceptance=rule,
                                       max_new_tokens=40, eos_token_id=1)
            assert torch.equal(out.sequences, expected), (drafter_name, rule)


def test_sampling_is_lossless_against_the_quantized_target():
    vocab = 5

    def peaked(seed):
        model = tiny_causal_lm("llama", seed=seed, vocab=vocab)
        with torch.no_grad():
            model.lm_head.weight.mul_(40)
        return quantize_weights(model)

    target, draft = peaked(0), peaked(1)
    p_value = two_token_chi_square(target, torch.tensor([[1, 2, 3]]), drafter=ModelDrafter(draft, Chain(2)),
                                   acceptance=SpeculativeSampling(), sampling=SamplingConfig(temperature=1.0),
                                   trials=600)
    assert p_value > 1e-3


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int4'"):
        quantize_weights(tiny_causal_lm("llama"), "int4")
    model = quantized()
    with pytest.raises(ValueError, match="already quantized"):
        quantize_weights(model)
    with pytest.raises(ValueError, match="no nn.Linear layers"):
        quantize_weights(tiny_causal_lm("gpt2"))  # Conv1D layers; the only nn.Linear is the LM head
    with pytest.raises(RuntimeError, match="not supported on device meta"):
        quantize_weights(tiny_causal_lm("llama").to("meta"))
    with pytest.raises(ValueError, match="unknown quantize scheme"):
        load("does-not-matter", quantize="int4")
    with pytest.raises(ValueError, match="nothing to pack"):
        load("does-not-matter", quantize="int8-all", pack=True)
    with pytest.raises(ValueError, match="2-D int8"):
        Int8Linear(torch.zeros(4, 4), torch.ones(4))
    with pytest.raises(ValueError, match="scale must be"):
        Int8Linear(torch.zeros(4, 4, dtype=torch.int8), torch.ones(3))


@pytest.mark.real_model
def test_real_model_int8_prompt_lookup_matches_its_generate():
    model, tokenizer = load("smollm2-135m-instruct", quantize="int8")
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 7 * model.config.num_hidden_layers
    ids = chat_input_ids(tokenizer, "Fix the spelling mistakes and return the corrected text: The large model then "
                                    "cheks all of them in one pass and keeps the ones it agres with.")
    eos = tokenizer.eos_token_id
    expected = reference(model, ids, 32, eos_token_id=eos)
    out = speculative_generate(model, ids, drafter=PromptLookup(num_tokens=6), acceptance=Greedy(),
                               max_new_tokens=32, eos_token_id=eos)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tau > 1.0
