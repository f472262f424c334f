"""Pre-packed bfloat16 linears: bit-equal to ``F.linear``, rows independent, speculation lossless with respect to the
packed target, the packed copy really is what runs (and ``stock_kernels`` really switches it off), clear errors."""

import pytest
import torch
import torch.nn.functional as F
from _tiny import VOCAB, tiny_causal_lm, tiny_tokenizer
from torch import nn

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.bench import run
from specprim.drafters import ModelDrafter, PromptLookup
from specprim.models import PackedLinear, load, pack_weights, quantize_weights, stock_kernels
from specprim.trees import Chain

pytestmark = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU / PyTorch build has no oneDNN bfloat16 support",
)


def packed_lm(seed=0):
    return pack_weights(tiny_causal_lm("llama", seed=seed).to(torch.bfloat16))


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear_bit_for_bit(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias).to(torch.bfloat16)
    x = torch.randn(2, 7, 96).to(torch.bfloat16)
    with torch.no_grad():
        want = F.linear(x, linear.weight, linear.bias)
        got = PackedLinear(linear)(x)
    assert got.shape == (2, 7, 80) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_packed_rows_equal_the_stock_kernel_and_are_independent_up_to_32_rows():
    """Bit for bit: a packed layer computes ``F.linear``'s output for every number of rows, and each row of a call of
    up to 32 rows equals that row scored alone. (From 33 rows on, oneDNN may switch kernels and round a row apart by
    an ulp on some CPUs, seen on an AVX512-BF16/AMX machine, for packed and stock layers alike.)"""
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536).to(torch.bfloat16)
    layer = PackedLinear(linear)
    x = torch.randn(64, 576).to(torch.bfloat16)
    with torch.no_grad():
        for rows in (1, 2, 5, 16, 32, 33, 64):
            assert torch.equal(layer(x[:rows]), F.linear(x[:rows], linear.weight, linear.bias))
        alone = torch.cat([layer(x[i : i + 1]) for i in range(32)])
        for rows in (2, 5, 16, 31, 32):
            assert torch.equal(layer(x[:rows]), alone[:rows])


def test_pack_weights_replaces_every_linear_and_keeps_the_checkpoint():
    model = tiny_causal_lm("llama").to(torch.bfloat16)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    keys = set(model.state_dict())
    head_weight = model.get_output_embeddings().weight
    prompt = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(prompt).logits
    assert pack_weights(model) is model
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == linears
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert set(model.state_dict()) == keys  # the packed copies are not saved
    assert model.get_output_embeddings().weight is head_weight  # shared, so a tied head stays tied
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, want, rtol=0, atol=1e-2)


def test_the_packed_copy_is_what_runs_and_stock_kernels_switch_it_off():
    """Re-pack one layer from zeros: its outputs become zero; inside ``stock_kernels`` it computes from ``weight``."""
    torch.manual_seed(0)
    linear = nn.Linear(32, 16, bias=False).to(torch.bfloat16)
    layer = PackedLinear(linear)
    zeros = nn.Linear(32, 16, bias=False).to(torch.bfloat16)
    nn.init.zeros_(zeros.weight)
    layer.packed_weight = PackedLinear(zeros).packed_weight
    x = torch.randn(3, 32).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.zeros(3, 16, dtype=torch.bfloat16))
        with stock_kernels():
            assert torch.equal(layer(x), F.linear(x, linear.weight))
        assert torch.equal(layer(x), torch.zeros(3, 16, dtype=torch.bfloat16))


@pytest.mark.parametrize("drafter", ["prompt-lookup", "model"])
def test_greedy_speculation_equals_the_packed_models_generate(drafter):
    target = packed_lm()
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    want = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                           eos_token_id=1, pad_token_id=0)
    draft = PromptLookup() if drafter == "prompt-lookup" else ModelDrafter(
        packed_lm(seed=1), Chain(4))
    got = speculative_generate(target, prompt, drafter=draft, acceptance=Greedy(), max_new_tokens=24,
                               eos_token_id=1)
    assert torch.equal(got.sequences, want)


def test_training_falls_back_to_f_linear_with_gradients():
    torch.manual_seed(0)
    linear = nn.Linear(8, 4).to(torch.bfloat16)
    layer = PackedLinear(linear)
    x = torch.randn(2, 8).to(torch.bfloat16)
    layer(x).float().sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.shape == (4, 8)


def test_quantized_models_pack_their_remaining_linears():
    model = quantize_weights(tiny_causal_lm("llama").to(torch.bfloat16))
    pack_weights(model)
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    assert not any(type(m) is nn.Linear for m in model.modules())


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(RuntimeError, match="bfloat16 weights on CPU"):
        pack_weights(tiny_causal_lm("llama"))  # float32
    model = packed_lm()
    with pytest.raises(ValueError, match="already packed"):
        pack_weights(model)
    with pytest.raises(RuntimeError, match="stays bfloat16 on CPU"):
        model.float()
    with pytest.raises(ValueError, match="no nn.Linear"):
        pack_weights(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="computes in bfloat16"):
        model.get_output_embeddings()(torch.zeros(1, 32))


def test_load_packs_a_saved_model(tmp_path):
    tiny_causal_lm("llama").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    model, _ = load(tmp_path, dtype=torch.bfloat16, pack=True)
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    with pytest.raises(RuntimeError, match="bfloat16 weights on CPU"):
        load(tmp_path, pack=True)  # float32


def test_bench_packs_every_method_and_times_the_stock_kernels():
    model = tiny_causal_lm("llama").to(torch.bfloat16)
    tokenizer = tiny_tokenizer()
    results = run(target=model, tokenizer=tokenizer, methods=["hf-unpacked", "prompt-lookup"], prompts=["t5 t6 t7"],
                  max_new_tokens=8, dtype="bfloat16", pack=True, argv=[])
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    assert results.meta["settings"]["pack"] is True
    assert [s.method for s in results.results] == ["hf", "hf-unpacked", "prompt-lookup"]
    with pytest.raises(ValueError, match="pack the target"):
        run(target=tiny_causal_lm("llama"), tokenizer=tokenizer, methods=["hf-unpacked"], prompts=["t5"],
            max_new_tokens=2, argv=[])
