"""Weight-only int8 and int4 quantization: the quantized linears against de-quantized references, row independence,
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
from specprim.models import (
    Int4Linear,
    Int8Linear,
    is_packed,
    load,
    pack_weights,
    packing_supported,
    quantize_weights,
)
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree


def reference(model, prompt, max_new_tokens, eos_token_id=1):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=eos_token_id, pad_token_id=0)


def quantized(arch="llama", seed=0, scheme="int8", **kwargs):
    return quantize_weights(tiny_causal_lm(arch, seed=seed, **kwargs), scheme)


QUANTIZED_LAYER = {"int8": Int8Linear, "int8-all": Int8Linear, "int4": Int4Linear, "int4-all": Int4Linear}


def _forward_matches(layer, linear, dequantized):
    """``layer`` on a (2, 5, K) input against the float64 product with ``dequantized`` (N, K); returns (x, output)."""
    dtype, (out_features, in_features) = dequantized.dtype, dequantized.shape
    x = torch.randn(2, 5, in_features).to(dtype)
    want = x.double() @ dequantized.double().T + (0 if linear.bias is None else linear.bias.double())
    got = layer(x)
    assert got.shape == (2, 5, out_features) and got.dtype == dtype
    tolerance = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), want, **tolerance)
    return x, got


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
    _forward_matches(layer, linear, dequantized.to(dtype))
    torch.testing.assert_close(layer.weight, dequantized.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_linear_matches_its_dequantized_matmul(dtype, bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 48, bias=bias).to(dtype)
    layer = Int4Linear.from_linear(linear)
    assert layer.weight_int4.dtype == torch.uint8 and layer.weight_int4.shape == (48, 48)
    assert layer.scales_and_zeros.shape == (3, 48, 2) and layer.scales_and_zeros.dtype == dtype
    dequantized = layer.weight  # (48, 96) as the kernel computes it
    groups = linear.weight.detach().double().reshape(48, 3, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 15  # (48, 3): one 4-bit step per group
    error = (dequantized.double().reshape(48, 3, 32) - groups).abs().amax(-1)
    slack = 0.51 if dtype == torch.float32 else 0.51 + 8 * 2**-8  # bfloat16 rounds the scale and the zero
    assert (error <= step * slack + 1e-7).all()
    x, got = _forward_matches(layer, linear, dequantized)
    kernel_weight = layer(torch.eye(96, dtype=dtype)).T - (linear.bias.detach()[:, None] if bias else 0)  # (48, 96)
    torch.testing.assert_close(kernel_weight, dequantized, rtol=0, atol=1e-6 if dtype == torch.float32 else 0.02)
    assert set(layer.state_dict()) == {"weight_int4", "scales_and_zeros"} | ({"bias"} if bias else set())
    rebuilt = Int4Linear(**{k: v for k, v in layer.state_dict().items()})  # the kernel's layout is made again
    assert torch.equal(rebuilt(x), got)


def test_int4_re_encodes_q4_1_blocks_exactly():
    """A weight on a Q4_1 grid (per 32 weights: float16 scale * q + float16 minimum, q in 0..15, both ends used) comes
    back bit for bit in float32, and groups of equal weights (zero, positive, negative) are exact in bfloat16 too."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (32, 4, 32), generator=generator)
    q[..., 0], q[..., 1] = 0, 15
    scale = (torch.rand(32, 4, 1, generator=generator) * 0.01 + 1e-3).half()  # GGUF stores both in float16
    minimum = (-torch.rand(32, 4, 1, generator=generator) * 0.1).half()
    grid = (scale.float() * q.float() + minimum.float()).reshape(32, 128)  # as GGUF de-quantizes, in float32
    linear = nn.Linear(128, 32, bias=False)
    with torch.no_grad():
        linear.weight.copy_(grid)
    assert torch.equal(Int4Linear.from_linear(linear).weight, grid)
    flat = torch.tensor([0.0, 0.3125, -1.7, 2.5e-3]).repeat_interleave(32).reshape(1, 128).repeat(16, 1)
    flat_linear = nn.Linear(128, 16, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        flat_linear.weight.copy_(flat)
    assert torch.equal(Int4Linear.from_linear(flat_linear).weight, flat_linear.weight)


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
    int4 = quantize_weights(tiny_causal_lm("llama"), "int4")
    assert sum(isinstance(m, Int4Linear) for m in int4.modules()) == linears - 1
    assert type(int4.get_output_embeddings()) is nn.Linear
    int4_all = quantize_weights(tiny_causal_lm("llama", vocab=96), "int4-all")
    assert isinstance(int4_all.get_output_embeddings(), Int4Linear)
    assert not any(isinstance(m, nn.Linear) for m in int4_all.modules())


@pytest.mark.skipif(not packing_supported(), reason="this CPU cannot pack bfloat16 weights")
def test_int4_leaves_the_lm_head_to_pack():
    """``pack_weights`` after ``"int4"`` packs the LM head only, and the model computes as before packing."""
    model = quantize_weights(tiny_causal_lm("llama").to(torch.bfloat16), "int4")
    prompt = torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(prompt).logits
        pack_weights(model)
        after = model(prompt).logits
    assert is_packed(model) and sum(isinstance(m, Int4Linear) for m in model.modules()) == 14
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def _scores(model, prompt, tokens, parents):
    """Target logits (N + 1, V) of ``[root] + tree`` for the tree ``tokens`` (N,) / ``parents`` (N,)."""
    target = HFTarget(model)
    target.start(prompt)
    tree = DraftTree(tokens=torch.tensor([tokens], dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long),
                     sampling="deterministic")
    return target.verify(prompt[:, -1], tree)[0][0]


@pytest.mark.parametrize("scheme", ["int8-all", "int4-all"])
def test_rows_are_independent(scheme):
    """A token's logits scored alone equal its logits inside a 16-token tree forward (fp32, summation-order noise)."""
    model = quantize_weights(tiny_causal_lm("llama", vocab=96), scheme)
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
    layer = QUANTIZED_LAYER[scheme].from_linear(nn.Linear(32, 16))
    rows = torch.randn(16, 32)
    rows[5:] *= 100  # large rows elsewhere in the batch do not change row 0 (no per-batch activation scale)
    torch.testing.assert_close(layer(rows)[:1], layer(rows[:1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantization_changes_the_model(scheme):
    plain, quant = tiny_causal_lm("llama"), quantized(scheme=scheme)
    prompt = torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (plain(prompt).logits - quant(prompt).logits).abs().max()
    assert difference > 1e-4  # far above fp32 noise
    prompts = [torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    assert any(not torch.equal(reference(plain, p, 40), reference(quant, p, 40)) for p in prompts)


@pytest.mark.parametrize("drafter_name", ["prompt-lookup", "quantized-draft-chain", "quantized-draft-tree",
                                          "unquantized-draft-chain", "eagle3-head", "eagle3-head, int8-all target",
                                          "prompt-lookup, int4 target", "int4-draft-tree, int4 target",
                                          "eagle3-head, int4-all target"])
def test_greedy_speculation_matches_the_quantized_target(drafter_name):
    scheme = drafter_name.partition(", ")[2].removesuffix(" target") or "int8"
    vocab = 96 if scheme == "int4-all" else VOCAB  # int4 needs an output size that is a multiple of 16
    target = quantize_weights(tiny_causal_lm("llama", seed=0, vocab=vocab), scheme)
    drafters = {
        "prompt-lookup": lambda: PromptLookup(num_tokens=6),
        "quantized-draft-chain": lambda: ModelDrafter(quantized(seed=1), Chain(3)),
        "quantized-draft-tree": lambda: ModelDrafter(quantized(seed=1), DynamicTree(depth=3, top_k=2, budget=6)),
        "unquantized-draft-chain": lambda: ModelDrafter(tiny_causal_lm("llama", seed=0), Chain(4)),
        "eagle3-head": lambda: eagle_drafter(EagleHead.from_target(target, version=3, draft_vocab_size=VOCAB // 2),
                                             DynamicTree(depth=3, top_k=2, budget=6)),
    }
    drafters["eagle3-head, int8-all target"] = drafters["eagle3-head, int4-all target"] = drafters["eagle3-head"]
    drafters["prompt-lookup, int4 target"] = drafters["prompt-lookup"]
    drafters["int4-draft-tree, int4 target"] = lambda: ModelDrafter(quantized(seed=1, scheme="int4"),
                                                                    DynamicTree(depth=3, top_k=2, budget=6))
    pattern = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    for prompt in (torch.cat([pattern, pattern, pattern[:, :4]], dim=1), pattern[:, :7]):
        expected = reference(target, prompt, 40)
        for rule in (Greedy(), SpeculativeSampling()):
            out = speculative_generate(target, prompt, drafter=drafters[drafter_name](), acceptance=rule,
                                       max_new_tokens=40, eos_token_id=1)
            assert torch.equal(out.sequences, expected), (drafter_name, rule)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_sampling_is_lossless_against_the_quantized_target(scheme):
    vocab = 5

    def peaked(seed):
        model = tiny_causal_lm("llama", seed=seed, vocab=vocab)
        with torch.no_grad():
            model.lm_head.weight.mul_(40)
        return quantize_weights(model, scheme)

    target, draft = peaked(0), peaked(1)
    p_value = two_token_chi_square(target, torch.tensor([[1, 2, 3]]), drafter=ModelDrafter(draft, Chain(2)),
                                   acceptance=SpeculativeSampling(), sampling=SamplingConfig(temperature=1.0),
                                   trials=600)
    assert p_value > 1e-3


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int3'"):
        quantize_weights(tiny_causal_lm("llama"), "int3")
    model = quantized()
    with pytest.raises(ValueError, match="already quantized"):
        quantize_weights(model)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_weights(quantized(scheme="int4"), "int8")
    with pytest.raises(ValueError, match=r"multiple of 16 .* lm_head \(97 x 32\)"):
        quantize_weights(tiny_causal_lm("llama"), "int4-all")  # a vocabulary of 97
    with pytest.raises(ValueError, match=r"multiple of 32; these are not: 1 \(32 x 48\)"):
        quantize_weights(nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 32)), "int4")
    with pytest.raises(RuntimeError, match="int4 weight-only quantization is not supported on device meta"):
        quantize_weights(tiny_causal_lm("llama").to("meta"), "int4")
    with pytest.raises(ValueError, match="no nn.Linear layers"):
        quantize_weights(tiny_causal_lm("gpt2"))  # Conv1D layers; the only nn.Linear is the LM head
    with pytest.raises(RuntimeError, match="not supported on device meta"):
        quantize_weights(tiny_causal_lm("llama").to("meta"))
    with pytest.raises(ValueError, match="unknown quantize scheme"):
        load("does-not-matter", quantize="int3")
    for scheme in ("int8-all", "int4-all"):
        with pytest.raises(ValueError, match="nothing to pack"):
            load("does-not-matter", quantize=scheme, pack=True)
    with pytest.raises(ValueError, match="2-D int8"):
        Int8Linear(torch.zeros(4, 4), torch.ones(4))
    with pytest.raises(ValueError, match="scale must be"):
        Int8Linear(torch.zeros(4, 4, dtype=torch.int8), torch.ones(3))
    with pytest.raises(RuntimeError, match="stays on the CPU"):
        quantized(scheme="int4").to("meta")
    with pytest.raises(ValueError, match="2-D uint8"):
        Int4Linear(torch.zeros(16, 16, dtype=torch.int8), torch.ones(1, 16, 2))
    with pytest.raises(ValueError, match=r"scales_and_zeros must be a floating \(1, 16, 2\)"):
        Int4Linear(torch.zeros(16, 16, dtype=torch.uint8), torch.ones(2, 16, 2))


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


@pytest.mark.real_model
def test_real_model_int4_holds_the_gguf_weights_and_prompt_lookup_matches_its_generate():
    """SmolLM2's layers are Q4_1 in its GGUF file: in float32 the int4 layers hold exactly the de-quantized weights,
    and prompt lookup on that int4 model decodes what its own ``generate`` decodes (float32: in bfloat16 a verified
    block and one-token steps can round a near tie apart on some CPUs)."""
    model, tokenizer = load("smollm2-135m-instruct")
    layers = {name: module.weight.detach().clone() for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and module is not model.get_output_embeddings()}
    quantize_weights(model, "int4")
    for name, module in model.named_modules():
        if isinstance(module, Int4Linear):
            assert torch.equal(module.weight, layers.pop(name)), name
    assert not layers  # every linear but the LM head
    ids = chat_input_ids(tokenizer, "Fix the spelling mistakes and return the corrected text: The large model then "
                                    "cheks all of them in one pass and keeps the ones it agres with.")
    eos = tokenizer.eos_token_id
    expected = reference(model, ids, 32, eos_token_id=eos)
    out = speculative_generate(model, ids, drafter=PromptLookup(num_tokens=6), acceptance=Greedy(),
                               max_new_tokens=32, eos_token_id=eos)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tau > 1.0
