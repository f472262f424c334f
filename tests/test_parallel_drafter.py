"""ParallelHead / ParallelDraftModel / ParallelObjective: one head forward drafts K tokens; greedy parity with
model.generate on tiny targets of several architectures (and SmolLM2), the declared q checked empirically, sampling
lossless (and a mislabelled variant rejected by the same check), drafting equal to what training scores, and clear
errors."""

import dataclasses

import pytest
import torch
from _tiny import tiny_causal_lm
from scipy import stats

from specprim import presets, speculative_generate
from specprim._types import DraftRequest, TargetFeatures
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import EagleDraftModel, EagleHead, ParallelDraftModel, ParallelHead, TreeDrafter
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.train._features import FeatureBatch
from specprim.train._parallel import ParallelObjective
from specprim.trees import Chain, DynamicTree, StaticTree

SMALL_VOCAB = 8  # random heads then guess right often enough to exercise accepted paths
K = 3
TREES = {
    "chain": Chain(K),
    "static": StaticTree(paths=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))),
    "dynamic": DynamicTree(depth=K, top_k=3, budget=8),
}


def head_for(target, num_draft=K, seed=0):
    torch.manual_seed(seed)
    return ParallelHead.from_target(target, num_draft)


def reference(target, prompt, max_new_tokens):
    return target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                           do_sample=False, eos_token_id=None, pad_token_id=0)


def request_for(target, head, ids, start=0, step=0, sampling=None, generator=None):
    """A DraftRequest for committed ``ids`` (B, T) with the head's target features at positions ``start .. T-2``."""
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    features = TargetFeatures(hidden_states=tuple(hidden[i][:, start:-1] for i in head.feature_layers),
                              token_ids=ids[:, start:-1], start=start)
    return DraftRequest(input_ids=ids, sampling=sampling or SamplingConfig(), vocab_size=SMALL_VOCAB, max_depth=8,
                        step=step, features=features, generator=generator)


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_parity_with_generate(arch, tree):
    target = tiny_causal_lm(arch, vocab=SMALL_VOCAB)
    prompt = torch.tensor([[2, 7, 4, 4, 6, 1, 3]])
    drafter = TreeDrafter(ParallelDraftModel(head_for(target)), tree)
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=24)
    assert torch.equal(out.sequences, reference(target, prompt, 24))
    assert max(out.stats.tree_depth) == (K if isinstance(tree, Chain) else max(out.stats.tree_depth)) >= 2


def test_one_token_prompt_and_reuse_across_generations():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    drafter = TreeDrafter(ParallelDraftModel(head_for(target)), Chain(K))
    for prompt in (torch.tensor([[4]]), torch.tensor([[3, 5, 6, 7]])):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=12)
        assert torch.equal(out.sequences, reference(target, prompt, 12))


def test_one_head_forward_per_draft_whatever_the_tree():
    target = tiny_causal_lm("qwen2", vocab=SMALL_VOCAB)
    head = head_for(target)
    calls = []
    original = head.predict
    head.predict = lambda *args, **kwargs: calls.append(args[0].shape[1]) or original(*args, **kwargs)
    prompt = torch.tensor([[2, 7, 4, 4, 6]])
    out = speculative_generate(target, prompt, drafter=TreeDrafter(ParallelDraftModel(head), TREES["dynamic"]),
                               acceptance=Greedy(), max_new_tokens=10)
    assert len(calls) == sum(1 for nodes in out.stats.tree_nodes if nodes)  # one forward per draft, none in extend
    assert calls[0] == prompt.shape[1] - 1 + K - 1  # the prompt's pairs and the K - 1 placeholders


def test_drafted_distributions_are_the_ones_training_scores():
    """The K distributions of one draft below a root at position r equal the objective's depth logits of chain
    r - 1 (what the trained loss sees is what drafting uses)."""
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target, num_draft=4)
    objective = ParallelObjective(head)
    ids = torch.tensor([[5, 6, 7, 2, 3, 4, 4, 1, 6]])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        batch = FeatureBatch(
            input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool),
            assistant_mask=torch.ones_like(ids, dtype=torch.bool),
            features=torch.stack([hidden[i] for i in objective.layers], dim=2),
            topk_ids=torch.zeros(1, ids.shape[1], 2, dtype=torch.long), topk_logprobs=torch.zeros(1, ids.shape[1], 2),
            layers=objective.layers)
        trained = objective.depth_logits(batch)  # 4 x (1, n, V)
    for root in (1, 5, 8):
        model = ParallelDraftModel(head)
        model.begin(request_for(target, head, ids[:, : root + 1]))
        drafted = [model.extend(torch.tensor([parent]), torch.tensor([[0]]))[0, 0] for parent in (-1, 0, 1)]
        first = model.begin(request_for(target, head, ids[:, : root + 1]))[0]  # the same context again: q_1
        for depth, row in enumerate([first, *drafted]):
            torch.testing.assert_close(row, trained[depth][0, root - 1].float(), rtol=1e-5, atol=1e-5)


def test_incremental_features_equal_a_fresh_start():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target)
    ids = torch.tensor([[5, 6, 7, 2, 3, 4, 4, 1, 6]])
    model = ParallelDraftModel(head)
    model.begin(request_for(target, head, ids[:, :4]))
    model.extend(torch.tensor([-1, -1]), torch.tensor([[1, 2]]))
    model.begin(request_for(target, head, ids[:, :7], start=3, step=1))
    incremental = model.begin(request_for(target, head, ids, start=6, step=2))
    fresh = ParallelDraftModel(head).begin(request_for(target, head, ids))
    torch.testing.assert_close(incremental, fresh, rtol=1e-5, atol=1e-5)


def _chi_square_p(tokens, probs):
    counts = torch.bincount(tokens, minlength=probs.shape[0]).double()
    expected = probs.double() * tokens.shape[0]
    keep = expected > 5
    observed = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    wanted = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    return stats.chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue


def test_declared_q_is_the_empirical_one():
    """20k chains drafted in one batch from one context at temperature 1: every depth's tokens follow the q row the
    tree declares for their parent, and that row does not depend on the tokens above (chi-square)."""
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target)
    with torch.no_grad():
        head.eagle.lm_head.weight.mul_(20)  # spread-out but not uniform draft distributions
    trials = 20_000
    ids = torch.tensor([[5, 6, 7, 2, 3]]).expand(trials, -1)
    request = request_for(target, head, ids, sampling=SamplingConfig(temperature=1.0),
                          generator=torch.Generator().manual_seed(3))
    tree = Chain(K).build(ParallelDraftModel(head), request)
    assert tree.sampling == "iid" and tree.q.shape == (trials, K + 1, SMALL_VOCAB)
    for depth in range(K):
        rows = tree.q[:, depth]
        assert torch.equal(rows, rows[:1].expand_as(rows))  # the same q whatever was drawn above
        assert _chi_square_p(tree.tokens[:, depth], rows[0]) > 1e-3
    wrong = torch.softmax(torch.log(tree.q[0, 1]) * 2, dim=-1)  # the check can fail: a sharper q is rejected
    assert _chi_square_p(tree.tokens[:, 1], wrong) < 1e-6


class _MislabelledQ:
    """A deliberately broken drafter: draws like the parallel drafter but declares a sharper q than it sampled."""

    def __init__(self, drafter):
        self.inner, self.feature_layers = drafter, drafter.feature_layers

    def propose(self, request):
        tree = self.inner.propose(request)
        if tree.q is None:
            return tree
        return dataclasses.replace(tree, q=torch.softmax(torch.log(tree.q.clamp_min(1e-30)) * 3, dim=-1))

    def observe(self, verdict):
        self.inner.observe(verdict)


TRIALS = 600


def test_sampling_is_lossless_and_a_mislabelled_q_is_rejected():
    target = tiny_causal_lm("llama", vocab=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(40)  # peaked next-token distributions
    torch.manual_seed(0)
    head = ParallelHead.from_target(target, 2)
    prompt = torch.tensor([[1, 2, 3]])
    sampling = SamplingConfig(temperature=1.0)
    honest = TreeDrafter(ParallelDraftModel(head), Chain(2))
    p_value = two_token_chi_square(target, prompt, drafter=honest, acceptance=SpeculativeSampling(),
                                   sampling=sampling, trials=TRIALS)
    assert p_value > 1e-3
    broken = _MislabelledQ(TreeDrafter(ParallelDraftModel(head), Chain(2)))
    p_broken = two_token_chi_square(target, prompt, drafter=broken, acceptance=SpeculativeSampling(),
                                    sampling=sampling, trials=TRIALS)
    assert p_broken < 1e-6


def test_from_eagle_keeps_the_eagle_heads_first_depth(tmp_path):
    target = tiny_causal_lm("qwen2", vocab=SMALL_VOCAB)
    torch.manual_seed(0)
    eagle = EagleHead.from_target(target, version=3)
    head = ParallelHead.from_eagle(eagle, 4)
    assert head.eagle is not eagle  # a copy: training it leaves the EAGLE-3 head as it was
    request = request_for(target, head, torch.tensor([[5, 6, 7, 2, 3]]))
    torch.testing.assert_close(ParallelDraftModel(head).begin(request), EagleDraftModel(eagle).begin(request))
    head.save_pretrained(tmp_path)
    loaded = ParallelHead.from_pretrained(tmp_path, target)
    assert loaded.num_draft == 4
    models = [ParallelDraftModel(head), ParallelDraftModel(loaded)]
    first = [model.begin(request) for model in models]
    assert torch.equal(first[0], first[1])
    assert torch.equal(models[0]._depth_logits, models[1]._depth_logits)


def test_objective_learns_and_touches_no_target_weight():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target, num_draft=3)
    objective = ParallelObjective(head, greedy=True)
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    torch.manual_seed(1)
    ids = torch.randint(2, SMALL_VOCAB, (2, 12))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    top = out.logits.log_softmax(-1).topk(2)
    batch = FeatureBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool),
        assistant_mask=torch.ones_like(ids, dtype=torch.bool),
        features=torch.stack([out.hidden_states[i] for i in objective.layers], dim=2),
        topk_ids=top.indices, topk_logprobs=top.values, layers=objective.layers)
    optimizer = torch.optim.Adam([p for p in objective.parameters() if p.requires_grad], lr=3e-3)
    first = objective(batch)
    for _ in range(30):
        optimizer.zero_grad()
        objective(batch).loss.backward()
        optimizer.step()
    last = objective(batch)
    assert last.loss < 0.7 * first.loss
    assert last.metrics["acc_3"] > first.metrics["acc_3"]
    assert set(first.metrics) >= {"acc_1", "acc_3", "chain_3", "loss_2", "loss"}
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())


def test_bad_inputs_are_clear_errors(tmp_path):
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target)
    with pytest.raises(ValueError, match="num_draft must be a positive int"):
        ParallelHead.from_target(target, 0)
    with pytest.raises(TypeError, match="EAGLE-3 EagleHead"):
        ParallelHead(EagleHead.from_target(target, version=1), 3)
    with pytest.raises(TypeError, match="drafts with a ParallelHead"):
        ParallelDraftModel(EagleHead.from_target(target, version=3))
    with pytest.raises(TypeError, match="trains a ParallelHead"):
        ParallelObjective(EagleHead.from_target(target, version=3))
    ids = torch.tensor([[5, 6, 7, 2, 3]])
    model = ParallelDraftModel(head)
    with pytest.raises(ValueError, match="call begin"):
        model.extend(torch.tensor([-1]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="needs request.features"):
        model.begin(DraftRequest(input_ids=ids, sampling=SamplingConfig(), vocab_size=SMALL_VOCAB, max_depth=3))
    model.begin(request_for(target, head, ids))
    model.extend(torch.tensor([-1]), torch.tensor([[1]]))
    model.extend(torch.tensor([0]), torch.tensor([[2]]))
    with pytest.raises(ValueError, match="drafts 3 positions: a node at depth 3"):
        model.extend(torch.tensor([1]), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="not the root"):
        model.extend(torch.tensor([4]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="starts at position 5 but the head holds 4"):  # position 4 skipped
        model.begin(request_for(target, head, torch.tensor([[5, 6, 7, 2, 3, 4, 1]]), start=5, step=1))
    with pytest.raises(ValueError, match="drafts 1 .. 3 tokens"):
        presets.parallel(head, k=4)
    with pytest.raises(ValueError, match="drafts 3 positions"):
        speculative_generate(target, ids, drafter=TreeDrafter(ParallelDraftModel(head), Chain(4)),
                             acceptance=Greedy(), max_new_tokens=8)
    head.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size=8.*vocab_size=97"):
        ParallelHead.from_pretrained(tmp_path, tiny_causal_lm("llama"))
    with pytest.raises(ValueError, match="holds a ParallelHead checkpoint, not a EagleHead"):
        EagleHead.from_pretrained(tmp_path, target)


@pytest.mark.real_model
def test_greedy_parity_on_smollm2():
    """The shipped EAGLE-3 head made parallel (untrained placeholders): speculative decoding equals generate."""
    from specprim.cli import chat_input_ids
    from specprim.models import load, load_head

    model, tokenizer = load("smollm2-135m-instruct")
    torch.manual_seed(0)
    head = ParallelHead.from_eagle(load_head("smollm2-135m-instruct-eagle3", model), 4)
    ids = chat_input_ids(tokenizer, "List three facts about the Moon.")
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    out = presets.parallel(head).generate(model, ids, max_new_tokens=48, eos_token_id=tokenizer.eos_token_id)
    assert torch.equal(out.sequences, expected)
    assert sum(out.stats.accepted) > 0


def test_tune_stays_within_its_depth_and_a_union_composes(tmp_path):
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target)
    assert presets.parallel(head).drafter.model.max_depth == K  # `specprim tune` caps its probe tree's depth here
    head.save_pretrained(tmp_path)
    union = presets.from_name("parallel+prompt-lookup", target=target, head=str(tmp_path), num_draft=K)
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    out = union.generate(target, prompt, max_new_tokens=16)
    assert torch.equal(out.sequences, reference(target, prompt, 16))
