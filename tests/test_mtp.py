"""MTPHead / MTPDraftModel: greedy parity with model.generate for every tree builder on tiny random targets
(untrained heads), tree attention equal to separate root-to-node paths, incremental feature updates equal to
a fresh start, losslessness under sampling, checkpoints, and clear errors."""

import pytest
import torch
from _tiny import tiny_causal_lm
from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

from specprim import speculative_generate
from specprim._types import DraftRequest, TargetFeatures
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import TreeDrafter
from specprim.drafters._medusa import MedusaHeads
from specprim.drafters._mtp import MTPDraftModel, MTPHead
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree, StaticTree

SMALL_VOCAB = 8  # random heads then guess right often enough to exercise accepted paths and cache gathering
TREES = {
    "chain": Chain(3),
    "static": StaticTree(paths=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))),
    "dynamic": DynamicTree(depth=3, top_k=3, budget=8),
}


def reference(target, prompt, max_new_tokens):
    return target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )


def head_for(target, seed=0):
    torch.manual_seed(seed)
    return MTPHead.from_target(target)


def request_for(target, ids, start=0, step=0):
    """A greedy DraftRequest for committed ``ids`` (1, T) with the target's last hidden states at positions
    ``start .. T - 2``."""
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[-1]  # (1, T, H)
    features = TargetFeatures(hidden_states=(hidden[:, start:-1],), token_ids=ids[:, start:-1], start=start)
    return DraftRequest(
        input_ids=ids, sampling=SamplingConfig(), vocab_size=SMALL_VOCAB, max_depth=8, step=step, features=features,
    )


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma3"])
def test_greedy_parity_with_generate(arch, tree):
    target = tiny_causal_lm(arch, vocab=SMALL_VOCAB)
    prompt = torch.tensor([[2, 7, 4, 4, 6, 1, 3]])
    drafter = TreeDrafter(MTPDraftModel(head_for(target)), tree)
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=24)
    assert torch.equal(out.sequences, reference(target, prompt, 24))
    if not isinstance(tree, Chain):  # an untrained chain often guesses nothing; these trees always accept some
        assert sum(out.stats.accepted) > 0


def test_one_token_prompt_and_reuse_across_generations():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    drafter = TreeDrafter(MTPDraftModel(head_for(target)), Chain(2))
    for prompt in (torch.tensor([[4]]), torch.tensor([[3, 5, 6, 7]])):  # the second run starts a new cache
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=12)
        assert torch.equal(out.sequences, reference(target, prompt, 12))


def test_extend_on_a_tree_equals_each_path_separately():
    target = tiny_causal_lm("qwen2", vocab=SMALL_VOCAB)
    head = head_for(target)
    request = request_for(target, torch.tensor([[5, 6, 7, 2, 3]]))
    tree_model = MTPDraftModel(head)
    tree_model.begin(request)
    # scratch nodes 0, 1 below the root; 2, 3 below 0 and 4 below 1; 5 below 3 (three batched calls)
    calls = [([-1, -1], [4, 6]), ([0, 0, 1], [2, 7, 4]), ([3], [1])]
    parents, tokens, logits = [], [], []
    for call_parents, call_tokens in calls:
        logits.append(tree_model.extend(torch.tensor(call_parents), torch.tensor([call_tokens]))[0])  # (M, V)
        parents += call_parents
        tokens += call_tokens
    logits = torch.cat(logits)  # (6, V)
    for node in range(len(parents)):
        path = [node]
        while parents[path[0]] != -1:
            path.insert(0, parents[path[0]])
        chain_model = MTPDraftModel(head)
        chain_model.begin(request)
        for depth, on_path in enumerate(path):
            row = chain_model.extend(torch.tensor([depth - 1]), torch.tensor([[tokens[on_path]]]))[0, 0]
        torch.testing.assert_close(row, logits[node], rtol=1e-5, atol=1e-5)


def test_incremental_features_equal_a_fresh_start():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head = head_for(target)
    ids = torch.tensor([[5, 6, 7, 2, 3, 4, 4, 1, 6]])
    model = MTPDraftModel(head)
    model.begin(request_for(target, ids[:, :4]))
    model.extend(torch.tensor([-1, -1]), torch.tensor([[1, 2]]))  # scratch, dropped by the next begin
    model.extend(torch.tensor([0]), torch.tensor([[3]]))
    model.begin(request_for(target, ids[:, :7], start=3, step=1))
    model.extend(torch.tensor([-1]), torch.tensor([[0]]))
    incremental = model.begin(request_for(target, ids, start=6, step=2))
    fresh = MTPDraftModel(head).begin(request_for(target, ids))
    torch.testing.assert_close(incremental, fresh, rtol=1e-5, atol=1e-5)


def test_features_must_continue_the_committed_positions():
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    model = MTPDraftModel(head_for(target))
    ids = torch.tensor([[5, 6, 7, 2, 3, 4]])
    model.begin(request_for(target, ids[:, :4]))
    with pytest.raises(ValueError, match="features start at position 4"):
        model.begin(request_for(target, ids, start=4, step=1))  # positions 3 was skipped
    with pytest.raises(ValueError, match="request.features is None"):
        model.begin(DraftRequest(input_ids=ids, sampling=SamplingConfig(), vocab_size=SMALL_VOCAB, max_depth=3))
    with pytest.raises(ValueError, match="earlier scratch nodes"):
        model.begin(request_for(target, ids))
        model.extend(torch.tensor([0]), torch.tensor([[1]]))


def test_save_load_round_trip(tmp_path):
    target = tiny_causal_lm("gemma3", vocab=SMALL_VOCAB)
    head = head_for(target)
    head.save_pretrained(tmp_path)
    loaded = MTPHead.from_pretrained(tmp_path, target)
    assert loaded.config == head.config
    request = request_for(target, torch.tensor([[5, 6, 7, 2, 3]]))
    models = [MTPDraftModel(head), MTPDraftModel(loaded)]
    for model in models:
        model.begin(request)
    logits = [model.extend(torch.tensor([-1, -1]), torch.tensor([[3, 4]])) for model in models]
    assert torch.equal(logits[0], logits[1])


def test_target_modules_are_shared_not_saved_and_untouched(tmp_path):
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    head = head_for(target)
    target_tensors = {p.data_ptr() for p in target.parameters()}
    assert not target_tensors & {p.data_ptr() for p in head.parameters()}
    assert all(name.split(".")[0] in {"hidden_norm", "token_norm", "proj", "block"} for name in head.state_dict())
    assert head.block.config.num_hidden_layers == 1
    prompt = torch.tensor([[5, 6, 7]])
    speculative_generate(target, prompt, drafter=TreeDrafter(MTPDraftModel(head), Chain(3)),
                         acceptance=Greedy(), max_new_tokens=6)
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())
    assert target.config.num_hidden_layers == 2


def test_loading_on_another_target_is_a_clear_error(tmp_path):
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    head_for(target).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size=8.*vocab_size=97"):
        MTPHead.from_pretrained(tmp_path, tiny_causal_lm("llama"))
    narrow = LlamaForCausalLM(LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="hidden_size=32.*hidden_size=16"):
        MTPHead.from_pretrained(tmp_path, narrow)
    with pytest.raises(ValueError, match="'llama' layer but the target is 'qwen2'"):
        MTPHead.from_pretrained(tmp_path, tiny_causal_lm("qwen2", vocab=SMALL_VOCAB))
    with pytest.raises(ValueError, match="holds a MTPHead checkpoint, not a MedusaHeads"):
        MedusaHeads.from_pretrained(tmp_path, target)


def test_unsupported_architecture_is_named():
    bloom = BloomForCausalLM(BloomConfig(vocab_size=SMALL_VOCAB, hidden_size=32, n_layer=1, n_head=4))
    with pytest.raises(TypeError, match=r"BloomModel block \(BloomForCausalLM\).*position_ids"):
        MTPHead.from_target(bloom)


VOCAB = 5
TRIALS = 1000


def test_first_two_tokens_match_plain_sampling_with_an_iid_chain():
    torch.manual_seed(0)
    target = tiny_causal_lm("llama", vocab=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(40)  # peaked next-token distributions
    prompt = torch.tensor([[1, 2, 3]])
    drafter = TreeDrafter(MTPDraftModel(head_for(target)), Chain(2))
    p_value = two_token_chi_square(target, prompt, drafter=drafter, acceptance=SpeculativeSampling(),
                                   sampling=SamplingConfig(temperature=1.0), trials=TRIALS)
    assert p_value > 1e-3
