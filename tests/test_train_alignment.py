"""Token-alignable masks and HASS's top-K distillation loss on hand-made tensors with known answers."""

import math

import pytest
import torch

from specprim.train._alignment import draft_topk_hits, topk_distillation_loss

# ------------------------------------------------------------------------------------------------ draft_topk_hits


def test_draft_topk_hits_counts_the_target_token_among_the_draft_best_k():
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0],  # ranking 0 1 2 3
                            [1.0, 2.0, 3.0, 4.0],  # ranking 3 2 1 0
                            [0.0, 5.0, 1.0, 2.0]]])  # ranking 1 3 2 0; (1, 3, 4)
    tokens = torch.tensor([[1, 3, 3]])  # (1, 3)
    assert draft_topk_hits(logits, tokens, 1).tolist() == [[False, True, False]]
    assert draft_topk_hits(logits, tokens, 2).tolist() == [[True, True, True]]
    assert draft_topk_hits(logits, torch.tensor([[3, 0, 0]]), 3).tolist() == [[False, False, False]]
    assert draft_topk_hits(logits, torch.tensor([[3, 0, 0]]), 4).tolist() == [[True, True, True]]


def test_draft_topk_hits_maps_draft_ids_to_target_ids():
    logits = torch.tensor([[0.0, 1.0, 9.0]])  # (1, V_d = 3): the draft's argmax is draft id 2
    d2t = torch.tensor([5, 7, 11])  # draft id -> target id
    assert draft_topk_hits(logits, torch.tensor([11]), 1, d2t).tolist() == [True]
    assert draft_topk_hits(logits, torch.tensor([2]), 1, d2t).tolist() == [False]  # a draft id is not a target id
    assert draft_topk_hits(logits, torch.tensor([7]), 2, d2t).tolist() == [True]


@pytest.mark.parametrize("k, error", [(0, ValueError), (5, ValueError), (True, TypeError), (1.0, TypeError)])
def test_draft_topk_hits_rejects_bad_k(k, error):
    with pytest.raises(error, match="k must"):
        draft_topk_hits(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), k)


def test_draft_topk_hits_rejects_mismatched_tokens():
    with pytest.raises(ValueError, match="tokens"):
        draft_topk_hits(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), 1)


# ------------------------------------------------------------------------------------------ topk_distillation_loss


def labels(probs):
    """(1, 2, K) target ids 0..K-1 and log-probabilities from (2, K) probabilities (0 -> -inf padding)."""
    probs = torch.tensor(probs)
    return torch.arange(probs.shape[-1]).expand(1, *probs.shape), probs.log().unsqueeze(0)


def test_topk_loss_uses_the_raw_target_probabilities_of_the_top_k():
    # Uniform draft over V = 4: log q = -log 4 for every token, so the loss is log 4 times the top-k mass.
    ids, logprobs = labels([[0.5, 0.25, 0.125], [0.9, 0.05, 0.0]])
    logits = torch.zeros(1, 2, 4)
    both = torch.ones(1, 2, dtype=torch.bool)
    assert float(topk_distillation_loss(logits, ids, logprobs, both, 2)) == pytest.approx(
        math.log(4) * (0.75 + 0.95) / 2)  # renormalised it would be log 4 exactly
    assert float(topk_distillation_loss(logits, ids, logprobs, both, 1)) == pytest.approx(math.log(4) * 1.4 / 2)
    assert float(topk_distillation_loss(logits, ids, logprobs, both, 3)) == pytest.approx(
        math.log(4) * (0.875 + 0.95) / 2)  # the -inf padding weighs nothing


def test_topk_loss_counts_only_masked_positions_and_is_zero_without_any():
    ids, logprobs = labels([[0.5, 0.25], [0.9, 0.05]])
    logits = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])  # (1, 2, 4)
    first = torch.tensor([[True, False]])
    logq = torch.log_softmax(logits[0, 0], -1)
    expected = -(0.5 * logq[0] + 0.25 * logq[1])
    assert float(topk_distillation_loss(logits, ids, logprobs, first, 2)) == pytest.approx(float(expected))
    assert float(topk_distillation_loss(logits, ids, logprobs, torch.zeros(1, 2, dtype=torch.bool), 2)) == 0.0


def test_topk_loss_drops_tokens_outside_the_draft_vocabulary():
    ids, logprobs = labels([[0.5, 0.25], [0.9, 0.05]])  # target ids 0, 1
    t2d = torch.tensor([-1, 0, -1, 1])  # target id 0 has no draft id, target id 1 is draft id 0
    logits = torch.zeros(1, 2, 2)  # V_d = 2: log q = -log 2
    both = torch.ones(1, 2, dtype=torch.bool)
    assert float(topk_distillation_loss(logits, ids, logprobs, both, 2, t2d=t2d)) == pytest.approx(
        math.log(2) * (0.25 + 0.05) / 2)


def test_topk_loss_gradient_pulls_up_the_target_top_tokens_only():
    ids, logprobs = labels([[0.6, 0.3], [0.6, 0.3]])
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    topk_distillation_loss(logits, ids, logprobs, torch.ones(1, 2, dtype=torch.bool), 2).backward()
    grad = logits.grad[0, 0]  # d loss / d logit = (sum p) q - p, halved by the mean over 2 positions
    assert grad.tolist() == pytest.approx([(0.9 * 0.25 - 0.6) / 2, (0.9 * 0.25 - 0.3) / 2, 0.9 * 0.25 / 2,
                                           0.9 * 0.25 / 2])


@pytest.mark.parametrize("k, error", [(0, ValueError), (3, ValueError), (False, TypeError)])
def test_topk_loss_rejects_k_outside_the_cached_labels(k, error):
    ids, logprobs = labels([[0.5, 0.25], [0.9, 0.05]])  # K = 2 cached
    with pytest.raises(error, match="k must"):
        topk_distillation_loss(torch.zeros(1, 2, 4), ids, logprobs, torch.ones(1, 2, dtype=torch.bool), k)
