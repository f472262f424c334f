"""The unrolled steps' attention without the dense mask equals SDPA with the mask, values and gradients."""

import pytest
import torch
from _tiny import tiny_causal_lm
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specprim.drafters import EagleHead
from specprim.masks import additive_mask
from specprim.train import EagleObjective
from specprim.train import _unrolled_attention as module
from specprim.train._unrolled import unrolled_mask
from specprim.train._unrolled_attention import is_unrolled_mask, unrolled_attention, unrolled_attention_in


class _Layer(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _inputs(step, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, length, dim = 2, 6, 2, 29, 16
    query = torch.randn(batch, heads, length, dim, generator=generator).to(dtype).requires_grad_()
    key = torch.randn(batch, kv_heads, (step + 1) * length, dim, generator=generator).to(dtype).requires_grad_()
    value = torch.randn(batch, kv_heads, (step + 1) * length, dim, generator=generator).to(dtype).requires_grad_()
    grad = torch.randn(batch, length, heads, dim, generator=generator).to(dtype)  # (B, n, H, D) as returned
    return query, key, value, grad


def _outputs(attention, query, key, value, grad, mask):
    out, _ = attention(_Layer(), query, key, value, mask, scaling=0.25)
    return (out, *torch.autograd.grad(out, (query, key, value), grad))


def _assert_same(mask, step, atol=2e-6):
    query, key, value, grad = _inputs(step)
    got = _outputs(unrolled_attention, query, key, value, grad, mask)
    want = _outputs(sdpa_attention_forward, query, key, value, grad, mask)
    for name, a, b in zip(("out", "grad query", "grad key", "grad value"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-5, msg=name)


@pytest.mark.parametrize("step", [0, 1, 2])
def test_the_merged_attention_equals_sdpa_with_the_unrolled_mask(step):
    mask = additive_mask(unrolled_mask(29, step), batch_size=2, dtype=torch.float32, device="cpu")
    assert is_unrolled_mask(mask, 29)
    _assert_same(mask, step)


def test_other_masks_take_sdpa_and_a_wrong_detection_is_caught(monkeypatch):
    causal_blocks = torch.ones(29, 29, dtype=torch.bool).tril().repeat(1, 3)  # (n, 3n) causal in every block
    mask = additive_mask(causal_blocks, batch_size=2, dtype=torch.float32, device="cpu")
    assert not is_unrolled_mask(mask, 29)
    assert not is_unrolled_mask(mask[:, :, :, :58], 29)
    _assert_same(mask, 2)  # handed to SDPA unchanged
    monkeypatch.setattr(module, "is_unrolled_mask", lambda mask, length: True)  # a broken layout check
    with pytest.raises(AssertionError):
        _assert_same(mask, 2)


def test_bfloat16_under_autocast_stays_close_to_sdpa():
    query, key, value, grad = _inputs(2, seed=1)
    mask = additive_mask(unrolled_mask(29, 2), batch_size=2, dtype=torch.bfloat16, device="cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _outputs(unrolled_attention, query, key, value, grad, mask)
        want = _outputs(sdpa_attention_forward, query, key, value, grad, mask)
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=0.05, rtol=0.05)


def test_an_eagle_objective_step_takes_the_merged_path_and_restores_sdpa(monkeypatch):
    target = tiny_causal_lm("llama", seed=3)
    head = EagleHead.from_target(target, version=3, generator=torch.Generator().manual_seed(0))
    assert head.layer_config._attn_implementation == "sdpa"
    calls = []
    merged = module._MergedAttention.apply
    monkeypatch.setattr(module._MergedAttention, "apply", lambda *a: calls.append(a[1].shape) or merged(*a))
    objective = EagleObjective(head, steps=3)
    ids = torch.randint(0, target.config.vocab_size, (2, 9))
    hidden = torch.randn(2, 9, target.config.hidden_size)
    cache = objective.new_cache()
    for step in range(3):
        mask = additive_mask(unrolled_mask(9, step), batch_size=2, dtype=torch.float32, device="cpu")
        objective.step(ids, hidden, torch.arange(9) + step, mask, cache)
    assert [shape[2] for shape in calls] == [9, 18, 27]
    assert head.layer_config._attn_implementation == "sdpa"
    with unrolled_attention_in(head.layer_config):
        assert head.layer_config._attn_implementation == module.UNROLLED_ATTENTION
    assert head.layer_config._attn_implementation == "sdpa"
