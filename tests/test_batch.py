"""Batched generation with ragged acceptance: every row equals its batch-1 run token for token under greedy (tiny
Llama, Qwen2, GPT-2; left padding; a different drafter per row, EAGLE features per row), rows really accept
different numbers of tokens in one step, a variant with hole masking switched off fails the same check, each
row's output distribution is the target's under sampling, and bad input raises clear errors."""

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from scipy import stats as scipy_stats

import specprim._batch as batch_module
from specprim import DraftTree, GenerateOutput, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import DraftRequest, EagleHead, ModelDrafter, PromptLookup, eagle_drafter
from specprim.hf._batched_target import BatchedHFTarget
from specprim.sampling import SamplingConfig
from specprim.testing import exact_two_token_distribution
from specprim.trees import Chain, DynamicTree

LENGTHS = (9, 4, 1, 13)  # one prompt per row, left-padded to 13


def left_pad(prompts, pad=0):
    """(B, T) ids and attention mask of ``prompts`` (1-D tensors), padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    return ids, mask


def make_prompts(seed=3, lengths=LENGTHS):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=generator) for n in lengths]


def hf_greedy(target, prompt, max_new_tokens, eos_token_id=None):
    return target.generate(prompt[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id,
                           pad_token_id=0)[0]


class OracleTree:
    """Three branches of depth 3 of random tokens; one random branch starts with a random-length prefix of the
    true continuation, so accepted paths are not node prefixes (the commit must gather)."""

    parents = [-1, -1, -1, 0, 1, 2, 3, 4, 5]

    def __init__(self, truth, seed=0):
        self.truth, self.rng = truth, torch.Generator().manual_seed(seed)

    def propose(self, request):
        position = request.input_ids.shape[1]
        tokens = torch.randint(0, request.vocab_size, (9,), generator=self.rng)
        branch, correct = int(torch.randint(0, 3, (1,), generator=self.rng)), int(
            torch.randint(0, 4, (1,), generator=self.rng))
        for depth in range(min(correct, len(self.truth) - position)):
            tokens[branch + 3 * depth] = self.truth[position + depth]
        return DraftTree(tokens=tokens[None], parents=torch.tensor(self.parents))

    def observe(self, verdict):
        pass


class Recording:
    """Wraps a drafter and keeps a copy of every request it receives."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []
        self.feature_layers = tuple(getattr(inner, "feature_layers", ()))

    def propose(self, request):
        self.requests.append(request)
        return self.inner.propose(request)

    def observe(self, verdict):
        self.inner.observe(verdict)


def ragged_steps(out):
    """Number of batched steps in which the rows still running accepted different numbers of tokens."""
    count = 0
    for step in range(out.forwards):
        accepted = {s.accepted[step] for s in out.row_stats if s.steps > step}
        count += len(accepted) > 1
    return count


def mixed_drafters(target, draft, prompts, budget):
    truth = hf_greedy(target, prompts[3], budget)
    return [
        ModelDrafter(draft, Chain(3)),  # a random draft model: accepts (almost) nothing
        PromptLookup(num_tokens=4),
        ModelDrafter(target, DynamicTree(depth=3, top_k=2, budget=6)),  # the target itself: accepts everything
        OracleTree(truth),
    ]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_rows_equal_their_batch_one_runs(arch):
    target, draft = tiny_causal_lm(arch, seed=0), tiny_causal_lm(arch, seed=1)
    prompts = make_prompts()
    ids, mask = left_pad(prompts)
    budget = 24
    out = speculative_generate(target, ids, mask, drafter=mixed_drafters(target, draft, prompts, budget),
                               acceptance=Greedy(), max_new_tokens=budget, pad_token_id=5)
    width = ids.shape[1]
    assert out.sequences.shape == (4, width + budget) and torch.equal(out.sequences[:, :width], ids)
    singles = mixed_drafters(target, draft, prompts, budget)
    for row, prompt in enumerate(prompts):
        alone = speculative_generate(target, prompt[None], drafter=singles[row], acceptance=Greedy(),
                                     max_new_tokens=budget)
        assert torch.equal(out.sequences[row, width - len(prompt):], alone.sequences[0]), (arch, row)
        assert torch.equal(alone.sequences[0], hf_greedy(target, prompt, budget))
        assert out.row_stats[row].accepted == alone.stats.accepted  # the same steps, not just the same text
    assert torch.equal(out.attention_mask, torch.cat([mask, torch.ones(4, budget, dtype=torch.long)], dim=1))
    assert ragged_steps(out) > 0  # rows accepted different numbers of tokens in the same forward
    assert out.forwards == max(s.steps for s in out.row_stats)
    assert out.stats.steps == sum(s.steps for s in out.row_stats)
    assert out.stats.new_tokens == 4 * budget


@pytest.mark.parametrize("compact_min", [1, 10**9], ids=["compact-every-step", "never-compact"])
def test_parity_does_not_depend_on_compaction(monkeypatch, compact_min):
    monkeypatch.setattr(batch_module, "COMPACT_MIN_SLOTS", compact_min)
    compactions = []
    original = BatchedHFTarget.compact
    monkeypatch.setattr(BatchedHFTarget, "compact", lambda self: (compactions.append(1), original(self)))
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompts = make_prompts(seed=4)
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, ids, mask, drafter=mixed_drafters(target, draft, prompts, 30),
                               acceptance=Greedy(), max_new_tokens=30)
    for row, prompt in enumerate(prompts):
        assert torch.equal(out.sequences[row, ids.shape[1] - len(prompt):], torch.cat([prompt, hf_greedy(
            target, prompt, 30)[len(prompt):]]))
    assert (len(compactions) > 0) == (compact_min == 1)


def test_unmasked_holes_break_parity(monkeypatch):
    """The parity check can fail: letting later tokens see the hole slots (KV of rejected draft nodes) changes
    the output."""
    original = BatchedHFTarget.commit

    def leaky_commit(self, paths):
        slots = self.num_slots
        original(self, paths)
        self.valid[:, slots:] = True  # holes become visible

    monkeypatch.setattr(BatchedHFTarget, "commit", leaky_commit)
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompts = make_prompts()
    ids, mask = left_pad(prompts)
    out = speculative_generate(target, ids, mask, drafter=mixed_drafters(target, draft, prompts, 24),
                               acceptance=Greedy(), max_new_tokens=24)
    assert ragged_steps(out) > 0
    same = [torch.equal(out.sequences[row, ids.shape[1] - len(p):], hf_greedy(target, p, 24))
            for row, p in enumerate(prompts)]
    assert not all(same)


def test_eagle_features_per_row():
    """Rows share one EAGLE-3 head (one drafter each); every row's drafter receives exactly the requests (ids and
    target features) of its batch-1 run."""
    target = tiny_causal_lm("llama", seed=0)
    head = EagleHead.from_target(target, version=3, draft_vocab_size=48, generator=torch.Generator().manual_seed(0))
    prompts = make_prompts(seed=5, lengths=(6, 1, 10))
    ids, mask = left_pad(prompts)
    tree = DynamicTree(depth=3, top_k=3, budget=8)
    batched = [Recording(eagle_drafter(head, tree)) for _ in prompts]
    out = speculative_generate(target, ids, mask, drafter=batched, acceptance=Greedy(), max_new_tokens=16)
    for row, prompt in enumerate(prompts):
        alone = Recording(eagle_drafter(head, tree))
        single = speculative_generate(target, prompt[None], drafter=alone, acceptance=Greedy(), max_new_tokens=16)
        assert torch.equal(out.sequences[row, ids.shape[1] - len(prompt):], single.sequences[0])
        assert len(batched[row].requests) == len(alone.requests)
        for got, want in zip(batched[row].requests, alone.requests, strict=True):
            assert torch.equal(got.input_ids, want.input_ids) and got.step == want.step
            assert got.features.start == want.features.start
            assert torch.equal(got.features.token_ids, want.features.token_ids)
            for a, b in zip(got.features.hidden_states, want.features.hidden_states, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_rows_stop_at_eos_and_budget_and_leave_the_batch():
    target = tiny_causal_lm("llama", seed=0)
    prompts = make_prompts(seed=6, lengths=(5, 7, 3))
    free = [hf_greedy(target, p, 20)[len(p):] for p in prompts]
    eos = int(free[0][4])  # row 0 stops at its 5th token or earlier; the others may run to the budget
    ids, mask = left_pad(prompts, pad=2)
    out = speculative_generate(target, ids, mask, drafter=[ModelDrafter(target, Chain(3)) for _ in prompts],
                               acceptance=Greedy(), max_new_tokens=20, eos_token_id=eos)
    width = ids.shape[1]
    lengths = []
    for row, prompt in enumerate(prompts):
        expected = hf_greedy(target, prompt, 20, eos_token_id=eos)[len(prompt):]
        expected = expected[: int((expected == eos).nonzero()[0, 0]) + 1] if (expected == eos).any() else expected
        generated = out.sequences[row, width:]
        assert torch.equal(generated[: len(expected)], expected)
        assert (generated[len(expected):] == target.generation_config.pad_token_id).all()  # the config's, as generate
        assert int(out.attention_mask[row].sum()) == len(prompt) + len(expected)
        lengths.append(len(expected))
    assert lengths[0] <= 5 and out.sequences.shape[1] == width + max(lengths)
    assert out.row_stats[0].steps < out.forwards  # the finished row left the batch


def test_batch_of_one_with_padding_equals_the_unpadded_run():
    target = tiny_causal_lm("qwen2", seed=0)
    prompt = make_prompts(seed=7, lengths=(6,))[0]
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt[None]], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], dim=1)
    out = speculative_generate(target, ids, mask, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=12)
    assert type(out) is GenerateOutput  # a one-row mask is a batch of one: the single-sequence path, unpadded
    assert torch.equal(out.sequences[0], hf_greedy(target, prompt, 12))
    with pytest.raises(ValueError, match="must be left padding"):
        speculative_generate(target, ids, mask.flip(1), drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=2)
    out = speculative_generate(target, prompt[None], drafter=[PromptLookup()], acceptance=Greedy(),
                               max_new_tokens=12)
    assert torch.equal(out.sequences[0], hf_greedy(target, prompt, 12)) and len(out.row_stats) == 1


# ---------------------------------------------------------------------------------------------------- sampling
SMALL_VOCAB = 5
TRIALS = 1200


def peaked(seed):
    model = tiny_causal_lm("llama", seed=seed, vocab=SMALL_VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def chi_square(counts, expected):
    expected = expected.flatten().double()
    expected = expected / expected.sum() * counts.sum()
    observed = counts.flatten().double()
    assert observed[expected == 0].sum() == 0, "emitted a pair of probability zero"
    big = expected >= 5
    observed_cells = torch.cat([observed[big], observed[~big].sum()[None]])
    expected_cells = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected_cells > 0
    return float(scipy_stats.chisquare(observed_cells[keep], expected_cells[keep]).pvalue)


def test_each_row_is_distributed_as_the_target():
    """B = 2 (different prompt lengths, left padding; an iid chain drafter and a deterministic tree): the first
    two tokens of each row follow plain sampling from the target (chi-square over 1200 batched runs)."""
    target, draft = peaked(0), peaked(1)
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 0])]
    ids, mask = left_pad(prompts)
    sampling = SamplingConfig(temperature=0.9, top_k=4)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, SMALL_VOCAB, SMALL_VOCAB)
    for _ in range(TRIALS):
        drafters = [ModelDrafter(draft, Chain(2)), ModelDrafter(draft, DynamicTree(depth=2, top_k=2, budget=3))]
        out = speculative_generate(target, ids, mask, drafter=drafters, acceptance=SpeculativeSampling(),
                                   max_new_tokens=2, temperature=0.9, top_k=4, generator=generator)
        for row in range(2):
            first, second = out.sequences[row, -2:].tolist()
            counts[row, first, second] += 1
    for row, prompt in enumerate(prompts):
        assert chi_square(counts[row], exact_two_token_distribution(target, prompt[None], sampling)) > 1e-3
    # the check has power: row 1's counts do not pass as row 0's distribution
    assert chi_square(counts[1], exact_two_token_distribution(target, prompts[0][None], sampling)) < 1e-6


# ---------------------------------------------------------------------------------------------------- errors
class TestBadInput:
    target = tiny_causal_lm("llama", seed=0)
    ids, mask = left_pad(make_prompts(lengths=(4, 2)))

    def run(self, **overrides):
        kwargs = dict(attention_mask=self.mask, drafter=[PromptLookup(), PromptLookup()], acceptance=Greedy(),
                      max_new_tokens=4)
        kwargs.update(overrides)
        return speculative_generate(self.target, kwargs.pop("ids", self.ids), **kwargs)

    @pytest.mark.parametrize(
        "overrides, message",
        [
            (dict(attention_mask=torch.ones(2, 3, dtype=torch.long)), "shape of input_ids"),
            (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])), "right padding"),
            (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])), "all padding"),
            (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [0, 0, 2, 1]])), "0 .padding. and 1"),
            (dict(drafter=PromptLookup()), "one drafter per row"),
            (dict(drafter=[PromptLookup()]), "1 drafters for batch size 2"),
            (dict(drafter=[PromptLookup()] * 2), "same drafter object"),
            (dict(streamer=object()), "streamer"),
            (dict(max_new_tokens=-1), "max_new_tokens"),
            (dict(max_new_tokens=300), "context window"),
            (dict(temperature=1.0), "greedy"),
        ],
    )
    def test_value_errors(self, overrides, message):
        with pytest.raises(ValueError, match=message):
            self.run(**overrides)

    def test_bad_tree_from_one_row(self):
        class Liar:
            def propose(self, request: DraftRequest):
                return DraftTree(tokens=torch.tensor([[VOCAB + 3]]), parents=torch.tensor([-1]))

            def observe(self, verdict):
                pass

        with pytest.raises(ValueError, match="outside the target's vocabulary"):
            self.run(drafter=[PromptLookup(), Liar()])

    def test_zero_budget_returns_the_prompts(self):
        out = self.run(max_new_tokens=0)
        assert torch.equal(out.sequences, self.ids) and out.forwards == 0
