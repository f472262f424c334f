"""MedusaHeads / MedusaDraftModel: greedy parity with model.generate for every tree builder on tiny random
targets (untrained heads), per-depth rows, losslessness under sampling, checkpoints, and clear errors."""

import pytest
import torch
from _tiny import tiny_causal_lm
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

from specprim import speculative_generate
from specprim._types import DraftRequest, TargetFeatures
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import TreeDrafter
from specprim.drafters._medusa import MedusaDraftModel, MedusaHeads, default_medusa_tree
from specprim.drafters._mtp import MTPHead
from specprim.sampling import SamplingConfig
from specprim.trees import Chain, DynamicTree, StaticTree

SMALL_VOCAB = 8  # random heads then guess right often enough to exercise accepted paths and cache gathering
TREES = {
    "default": default_medusa_tree(3),
    "chain": Chain(3),
    "dynamic": DynamicTree(depth=3, top_k=3, budget=8),
}


def reference(target, prompt, max_new_tokens):
    return target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )


def heads_for(target, seed=0, **hyperparameters):
    torch.manual_seed(seed)
    return MedusaHeads.from_target(target, **hyperparameters)


def request_for(hidden, step=0, start=0, vocab=SMALL_VOCAB):
    """A greedy request whose features are ``hidden`` (1, n, H) at positions ``start ..``."""
    ids = torch.zeros(1, start + hidden.shape[1] + 1, dtype=torch.long)
    features = TargetFeatures(hidden_states=(hidden,), token_ids=ids[:, start:-1], start=start)
    return DraftRequest(input_ids=ids, sampling=SamplingConfig(), vocab_size=vocab, max_depth=8, step=step,
                        features=features)


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma3"])
def test_greedy_parity_with_generate(arch, tree):
    target = tiny_causal_lm(arch, vocab=SMALL_VOCAB)
    prompt = torch.tensor([[2, 7, 4, 4, 6, 1, 3]])
    drafter = TreeDrafter(MedusaDraftModel(heads_for(target, num_heads=3)), tree)
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=24)
    assert torch.equal(out.sequences, reference(target, prompt, 24))
    if not isinstance(tree, Chain):  # an untrained chain often guesses nothing; these trees always accept some
        assert sum(out.stats.accepted) > 0


def test_shared_target_head_parity_and_one_token_prompt():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    heads = heads_for(target, num_heads=2, num_layers=2, share_target_head=True)
    drafter = TreeDrafter(MedusaDraftModel(heads), heads.default_tree())
    for prompt in (torch.tensor([[4]]), torch.tensor([[3, 5, 6, 7]])):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=16)
        assert torch.equal(out.sequences, reference(target, prompt, 16))
        assert sum(out.stats.accepted) > 0


def test_rows_follow_depth_and_the_latest_feature():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    heads = heads_for(target, num_heads=2)
    model = MedusaDraftModel(heads)
    hidden = torch.randn(1, 3, 32)
    root = model.begin(request_for(hidden))
    expected = heads(hidden[:, -1])  # (1, K, V)
    assert torch.equal(root, expected[:, 0])
    # nodes 0, 1 at depth 1; 2 at depth 2 (parent given in the same call); 3 at depth 3 (deeper than K = 2)
    rows = model.extend(torch.tensor([-1, -1, 0, 2]), torch.tensor([[1, 2, 3, 4]]))  # (1, 4, V)
    assert torch.equal(rows[:, 0], expected[:, 1]) and torch.equal(rows[:, 1], expected[:, 1])
    assert torch.equal(rows[:, 2], torch.zeros(1, SMALL_VOCAB)) and torch.equal(rows[:, 3], rows[:, 2])
    # no new position: keep the latest state; a new one replaces it
    assert torch.equal(model.begin(request_for(hidden[:, :0], step=1, start=3)), root)
    assert torch.equal(model.begin(request_for(hidden[:, :1], step=2, start=3)), heads(hidden[:, 0])[:, 0])


def test_default_tree():
    tree = default_medusa_tree()
    assert 20 <= len(tree.paths) <= 40 and tree.depth == 4
    assert default_medusa_tree(2).depth == 2 and default_medusa_tree(1).paths == ((0,), (1,), (2,), (3,), (4,))
    assert isinstance(heads_for(tiny_causal_lm("llama"), num_heads=3).default_tree(), StaticTree)


@pytest.mark.parametrize("share", [False, True], ids=["own-heads", "shared-head"])
def test_save_load_round_trip(tmp_path, share):
    target = tiny_causal_lm("qwen2", vocab=SMALL_VOCAB)
    heads = heads_for(target, num_heads=3, share_target_head=share)
    heads.save_pretrained(tmp_path)
    loaded = MedusaHeads.from_pretrained(tmp_path, target)
    assert loaded.config == heads.config
    hidden = torch.randn(2, 32)
    assert torch.equal(loaded(hidden), heads(hidden))
    assert all(name.startswith(("blocks.", "lm_heads.")) for name in loaded.state_dict())
    assert len(loaded.lm_heads) == (0 if share else 3)


def test_target_is_referenced_not_copied_or_touched():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    heads = heads_for(target, share_target_head=True)
    assert not {p.data_ptr() for p in target.parameters()} & {p.data_ptr() for p in heads.parameters()}
    prompt = torch.tensor([[5, 6, 7]])
    speculative_generate(target, prompt, drafter=TreeDrafter(MedusaDraftModel(heads), heads.default_tree()),
                         acceptance=Greedy(), max_new_tokens=6)
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())


def test_loading_on_another_target_is_a_clear_error(tmp_path):
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    heads_for(target).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size=8.*vocab_size=97"):
        MedusaHeads.from_pretrained(tmp_path, tiny_causal_lm("llama"))
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="hidden_size=32.*hidden_size=16"):
        MedusaHeads.from_pretrained(tmp_path, narrow)
    with pytest.raises(ValueError, match="holds a MedusaHeads checkpoint, not a MTPHead"):
        MTPHead.from_pretrained(tmp_path, target)
    with pytest.raises(FileNotFoundError):
        MedusaHeads.from_pretrained(tmp_path / "missing", target)


def test_bad_input():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        MedusaHeads.from_target(target, num_heads=0)
    model = MedusaDraftModel(heads_for(target))
    with pytest.raises(ValueError, match="the target has 97"):
        model.begin(request_for(torch.randn(1, 2, 32), vocab=97))
    request = DraftRequest(input_ids=torch.tensor([[1, 2]]), sampling=SamplingConfig(), vocab_size=SMALL_VOCAB,
                           max_depth=3)
    with pytest.raises(ValueError, match="request.features is None"):
        model.begin(request)


VOCAB = 5
TRIALS = 1000


def test_first_token_matches_plain_sampling():
    target = tiny_causal_lm("llama", vocab=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(40)  # peaked next-token distributions
    heads = heads_for(target, num_heads=2)
    drafter = TreeDrafter(MedusaDraftModel(heads), heads.default_tree())
    prompt = torch.tensor([[1, 2, 3]])
    sampling = dict(temperature=0.8, top_k=4)
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=SpeculativeSampling(),
                                   max_new_tokens=2, generator=generator, **sampling)
        counts[out.sequences[0, prompt.shape[1]]] += 1
    with torch.no_grad():
        p = SamplingConfig(**sampling).probs(target(prompt).logits[0, -1])  # (V,)
    assert counts[p == 0].sum() == 0, "emitted a token the target gives probability zero"
    keep = p * TRIALS >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = torch.cat([p[keep], p[~keep].sum()[None]]) * TRIALS
    assert stats.chisquare(observed[expected > 0], expected[expected > 0]).pvalue > 1e-3
