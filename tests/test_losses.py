"""The distillation loss against the target's top-K distribution: value and gradient equal the log-softmax formula."""

import pytest
import torch

from specprim.train._losses import soft_cross_entropy


def _log_softmax_loss(logits, topk_ids, topk_logprobs, mask, t2d=None, greedy=False):
    """The loss written out: renormalised target probabilities times the draft's log-probabilities."""
    if greedy:
        topk_ids, topk_logprobs = topk_ids[..., :1], topk_logprobs[..., :1]
    ids = topk_ids if t2d is None else t2d[topk_ids]
    probs = torch.softmax(topk_logprobs.masked_fill(ids < 0, float("-inf")), dim=-1).nan_to_num(0.0)
    logq = torch.log_softmax(logits.float(), dim=-1)
    loss = -(probs * logq.gather(-1, ids.clamp(min=0))).sum(-1)
    weight = mask.float()
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)


def _case(seed, dtype):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(2, 7, 50, generator=generator)).to(dtype).requires_grad_()  # (B, n, V_d)
    topk_ids = torch.randint(0, 80, (2, 7, 4), generator=generator)  # (B, n, K) target ids
    topk_logprobs = torch.log_softmax(torch.randn(2, 7, 4, generator=generator), -1)
    topk_logprobs[0, 1, 2:] = float("-inf")  # padding
    mask = torch.rand(2, 7, generator=generator) > 0.3
    t2d = torch.full((80,), -1, dtype=torch.long)
    t2d[:50] = torch.randperm(50, generator=generator)  # ids 50.. are outside the draft vocabulary
    topk_ids[1, 3] = torch.tensor([60, 61, 62, 63])  # a position the draft cannot express at all
    return logits, topk_ids, topk_logprobs, mask, t2d


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_and_its_gradient_equal_the_log_softmax_formula(dtype, greedy):
    logits, topk_ids, topk_logprobs, mask, t2d = _case(0, dtype)
    got = soft_cross_entropy(logits, topk_ids, topk_logprobs, mask, t2d=t2d, greedy=greedy)
    (got_grad,) = torch.autograd.grad(got, logits)
    want = _log_softmax_loss(logits, topk_ids, topk_logprobs, mask, t2d=t2d, greedy=greedy)
    (want_grad,) = torch.autograd.grad(want, logits)
    assert got.dtype == torch.float32 and got_grad.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(got_grad.float(), want_grad.float(), atol=tolerance, rtol=tolerance)
    assert float(got_grad[1, 3].abs().max()) == 0 or not bool(mask[1, 3])  # nothing to learn where nothing fits
    assert float(got_grad[~mask].abs().max()) == 0  # positions outside the mask get no gradient


def test_the_comparison_tells_a_wrong_gradient_apart(monkeypatch):
    """A backward pass that forgets the target's picks fails the check above (it can fail)."""
    from specprim.train import _losses

    def without_picks(ctx, grad):
        logits, _, weights, lse = ctx.saved_tensors
        return (torch.exp(logits.float() - lse[:, None]) * weights.sum(-1, keepdim=True) * grad), None, None

    monkeypatch.setattr(_losses._WeightedCrossEntropy, "backward", staticmethod(without_picks))
    with pytest.raises(AssertionError):
        test_the_loss_and_its_gradient_equal_the_log_softmax_formula(torch.float32, False)


def test_an_empty_mask_gives_zero_loss_and_gradient():
    logits, topk_ids, topk_logprobs, mask, _ = _case(2, torch.float32)
    loss = soft_cross_entropy(logits, topk_ids.clamp(max=49), topk_logprobs, torch.zeros_like(mask))
    (grad,) = torch.autograd.grad(loss, logits)
    assert float(loss.detach()) == 0 and float(grad.abs().max()) == 0
