"""Token-alignable masks and HASS's top-K distillation loss on hand-made tensors with known answers."""

import math

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm

from specprim.train import Example, FeatureBatch, FeatureDataset, build_feature_cache
from specprim.train._alignment import draft_topk_hits, topk_distillation_loss
from specprim.train._campaign import Campaign, CampaignHead
from specprim.train._losses import soft_cross_entropy
from specprim.train._pipeline import build_objective
from specprim.train._protocol import shift
from specprim.train._unrolled import Unrolling, unrolled_loss

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


# ----------------------------------------------------------------------------------- wired into unrolled_loss

V = 8  # the fake head's vocabulary
STEPS = 3


def label_batch(lengths=(9, 6), top_k=3, seed=0):
    """A right-padded batch with random labels: ``topk_ids[b, t]`` distinct ids (sorted log-probabilities)."""
    generator = torch.Generator().manual_seed(seed)
    batch, width = len(lengths), max(lengths)
    real = torch.arange(width) < torch.tensor(lengths)[:, None]  # (B, T)
    top_ids = torch.stack([torch.randperm(V, generator=generator)[:top_k] for _ in range(batch * width)])
    logprobs = torch.randn(batch * width, top_k, generator=generator).sort(-1, descending=True).values
    return FeatureBatch(
        input_ids=torch.randint(2, V, (batch, width), generator=generator) * real,
        attention_mask=real,
        assistant_mask=real,
        features=torch.zeros(batch, width, 1, 4),
        topk_ids=top_ids.view(batch, width, top_k) * real[..., None],
        topk_logprobs=logprobs.log_softmax(-1).view(batch, width, top_k).masked_fill(~real[..., None], -torch.inf),
        layers=(0,),
    )


class RankingHead:
    """An :class:`UnrolledHead` whose draft ranks the target's greedy token first on chains starting at odd
    positions and second (behind another token) on even ones, at every depth; ``uniform``: all logits 0."""

    def __init__(self, batch, uniform=False):
        self.batch, self.uniform = batch, uniform

    def initial_state(self, batch):
        return torch.zeros(*batch.input_ids.shape, 1)  # (B, T, 1)

    def new_cache(self):
        return None

    def step(self, tokens, state, positions, mask, cache):
        n, k = tokens.shape[1], int(positions[0])
        logits = torch.zeros(*tokens.shape, V)  # (B, n, V)
        if not self.uniform:
            label = (torch.arange(n) + k + 1).clamp(max=self.batch.input_ids.shape[1] - 1)  # (n,)
            greedy = self.batch.topk_ids[:, label, 0]  # (B, n)
            even = (torch.arange(n) % 2 == 0).expand_as(greedy)  # (B, n)
            logits.scatter_(-1, greedy[..., None], torch.where(even, 1.0, 2.0)[..., None])
            rival = torch.where(even, (greedy + 1) % V, greedy)  # even chains: another token ranks first
            logits.scatter_(-1, rival[..., None], torch.where(even, 1.5, 2.0)[..., None])
        return state, logits


def run(batch, **settings):
    head = RankingHead(batch, uniform=settings.pop("uniform", False))
    return unrolled_loss(head, batch, Unrolling(STEPS, **settings)).metrics


def test_align_topk_keeps_the_chains_a_k_wide_tree_reaches_and_chain_metrics_stay_greedy():
    batch = label_batch()
    plain, greedy, wide = run(batch), run(batch, align=True), run(batch, align=True, align_topk=2)
    assert greedy["loss_1"] == pytest.approx(plain["loss_1"])  # depth 1 trains on every chain
    n = batch.input_ids.shape[1] - 1  # chains
    for k in (2, 3):  # greedy alignment keeps the odd chains only; top-2 alignment keeps them all
        logits = RankingHead(batch).step(torch.zeros(2, n, dtype=torch.long), None, torch.arange(n) + k - 1, None,
                                         None)[1]  # (B, n, V) depth k
        odd = shift(batch.attention_mask, k, n, fill=False) & (torch.arange(n) % 2 == 1)  # (B, n)
        expected = soft_cross_entropy(logits, shift(batch.topk_ids, k, n),
                                      shift(batch.topk_logprobs, k, n, fill=-torch.inf), odd)
        assert greedy[f"loss_{k}"] == pytest.approx(float(expected))
        assert greedy[f"loss_{k}"] < plain[f"loss_{k}"] - 0.05  # the odd chains are the well-ranked ones
        assert wide[f"loss_{k}"] == pytest.approx(plain[f"loss_{k}"])
    for k in (1, 2, 3):
        assert plain[f"chain_{k}"] == greedy[f"chain_{k}"] == wide[f"chain_{k}"] > 0


def test_hass_topk_adds_the_weighted_top_k_loss_at_every_depth():
    batch = label_batch()
    plain = run(batch, uniform=True)
    hass = run(batch, uniform=True, hass_topk=2, hass_weight=0.5)
    probs = batch.topk_logprobs.exp()[..., :2].sum(-1)  # (B, T) the target's top-2 mass
    for k in (1, 2, 3):
        valid = batch.attention_mask[:, k:]  # label positions i + k that are real
        expected = 0.5 * math.log(V) * float(probs[:, k:][valid].mean())  # a uniform draft: log q = -log V
        assert hass[f"loss_{k}"] - plain[f"loss_{k}"] == pytest.approx(expected, rel=1e-5)
        assert hass[f"acc_{k}"] == plain[f"acc_{k}"]


@pytest.mark.parametrize("settings, message", [
    (dict(align_topk=2), "align_topk"), (dict(align=True, align_topk=0), "align_topk"),
    (dict(hass_topk=-1), "hass_topk"), (dict(hass_topk=2, hass_weight=0.0), "hass_weight"),
])
def test_unrolling_rejects_bad_alignment_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        Unrolling(STEPS, **settings)


def test_a_hass_topk_beyond_the_cached_labels_fails_at_the_first_batch_with_its_reason():
    with pytest.raises(ValueError, match="k must be in \\[1, 3\\]"):
        run(label_batch(top_k=3), hass_topk=4)


def test_build_objective_passes_the_options_to_unrolled_kinds_only(tmp_path):
    target = tiny_causal_lm("llama", seed=0)
    examples = [Example(torch.randint(2, VOCAB, (12,), generator=torch.Generator().manual_seed(i)),
                        torch.ones(12, dtype=torch.bool)) for i in range(3)]
    build_feature_cache(target, examples, tmp_path, layers=range(3), top_k=4, progress=False)
    dataset = FeatureDataset(tmp_path, batch_tokens=64, max_length=12)
    objective = build_objective("eagle3", target, dataset, align=True, align_topk=2, hass_topk=4, hass_weight=0.5)
    unrolling = objective.unrolling
    assert (unrolling.align, unrolling.align_topk, unrolling.hass_topk, unrolling.hass_weight) == (True, 2, 4, 0.5)
    assert build_objective("mtp", target, dataset).unrolling.hass_topk == 0
    with pytest.raises(ValueError, match="hass_topk=5 needs that many .* keeps 4"):
        build_objective("eagle3", target, dataset, hass_topk=5)
    with pytest.raises(ValueError, match="hass_topk trains unrolled draft depths"):
        build_objective("medusa", target, dataset, hass_topk=2)


def test_the_campaign_head_takes_the_options_and_an_older_record_loads_without_them():
    head = CampaignHead(align=True, align_topk=3, hass_topk=10, hass_weight=0.5)
    record = Campaign(target="m", run_dir="r", head=head).to_json()
    assert Campaign.from_json(record).head == head
    for name in ("align", "align_topk", "hass_topk", "hass_weight"):  # a campaign.json written before them
        del record["head"][name]
    older = Campaign.from_json(record).head
    assert (older.align, older.align_topk, older.hass_topk, older.hass_weight) == (False, 1, 0, 1.0)
    for make, message in ((lambda: CampaignHead(align_topk=2), "align_topk"),
                          (lambda: CampaignHead(hass_topk=-1), "hass_topk"),
                          (lambda: Campaign(target="m", run_dir="r", head=CampaignHead(hass_topk=17)), "<= top_k")):
        with pytest.raises(ValueError, match=message):
            make()
