"""Training objectives on a tiny Llama target: a short ``train`` run lowers every objective's loss, the saved
module reloads and decodes losslessly through its preset, and labels sit at the positions the drafters predict
(oracle draft modules score perfectly, their off-by-one variants do not)."""

import dataclasses
import json

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from transformers import AutoModelForCausalLM

from specprim import presets
from specprim.drafters import EagleHead, EagleOutput, MedusaHeads, MTPHead
from specprim.drafters._vocab import count_tokens
from specprim.train import (
    DistillObjective,
    EagleObjective,
    Example,
    FeatureBatch,
    FeatureDataset,
    MedusaObjective,
    MTPObjective,
    TrainConfig,
    build_feature_cache,
    train,
)

LAYERS = 2  # the target's decoder layers; output_hidden_states has LAYERS + 1 entries
PROMPT = 4  # prompt tokens of every training example (the rest is the target's greedy continuation)


def hf_greedy(target, prompt, max_new_tokens):
    return target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                           do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0)


@pytest.fixture(scope="module")
def data(target):
    """(24, 40): random 4-token prompts and the target's greedy continuations (self-distilled text)."""
    prompts = torch.randint(2, VOCAB, (24, PROMPT), generator=torch.Generator().manual_seed(0))
    return hf_greedy(target, prompts, 36)


@pytest.fixture(scope="module")
def dataset(target, data, tmp_path_factory):
    """A cache of every hidden state and the top-4 of ragged examples (20 .. 40 tokens), 2 of them held out."""
    examples = []
    for i, row in enumerate(data):
        ids = row[: 20 + i % 21]
        examples.append(Example(ids, torch.arange(len(ids)) >= PROMPT))
    directory = tmp_path_factory.mktemp("features")
    build_feature_cache(target, examples, directory, layers=range(LAYERS + 1), top_k=4, shard_tokens=300,
                        progress=False)
    return FeatureDataset(directory, batch_tokens=200, max_length=40, holdout=2)


# name -> (objective for a target, reload of the saved module, preset for the reloaded module)
OBJECTIVES = {
    "medusa": (
        lambda target, data: MedusaObjective(MedusaHeads.from_target(target, num_heads=3), num_target_layers=LAYERS),
        MedusaHeads.from_pretrained,
        presets.medusa,
    ),
    "distill": (
        lambda target, data: DistillObjective(tiny_causal_lm("llama", seed=1)),
        lambda directory, target: AutoModelForCausalLM.from_pretrained(directory),
        presets.leviathan,
    ),
    "eagle1": (
        lambda target, data: EagleObjective(EagleHead.from_target(target, version=1)),
        EagleHead.from_pretrained,
        presets.eagle,
    ),
    "eagle3": (
        lambda target, data: EagleObjective(EagleHead.from_target(
            target, version=3, draft_vocab_size=64, token_counts=count_tokens([data], VOCAB))),
        EagleHead.from_pretrained,
        presets.eagle3,
    ),
    "mtp": (
        lambda target, data: MTPObjective(MTPHead.from_target(target), num_target_layers=LAYERS),
        MTPHead.from_pretrained,
        presets.mtp,
    ),
}


@pytest.mark.parametrize("name", OBJECTIVES)
def test_training_lowers_the_loss_and_the_saved_module_decodes_losslessly(name, target, data, dataset, tmp_path):
    build, reload, preset = OBJECTIVES[name]
    torch.manual_seed(0)
    objective = build(target, data)
    per_epoch = len(dataset.batches(0))
    config = TrainConfig(epochs=12, lr=1e-2, warmup_steps=2, log_every=per_epoch, checkpoint_every=1000)
    evaluation = train(objective, dataset, tmp_path, config, progress=False)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    epochs = [record for record in log if not record.get("eval")]  # each: the means over one epoch
    assert len(epochs) == 12
    first, last = epochs[0], epochs[-1]
    assert last["loss"] < 0.95 * first["loss"], [record["loss"] for record in epochs]
    assert last["acc_1"] > first["acc_1"] + 0.2, [record["acc_1"] for record in epochs]
    assert {"loss", "acc_1"} <= set(evaluation)

    module = reload(tmp_path / "head", target)
    saved, trained = module.state_dict(), objective.module.state_dict()
    assert saved.keys() == trained.keys()
    assert all(torch.equal(saved[key], trained[key]) for key in saved)
    taus = []
    fresh = torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))
    for prompt in [*data[:4, None, :PROMPT], fresh]:  # four training prompts and an unseen one
        out = preset(module).generate(target, prompt, max_new_tokens=30, eos_token_id=None)  # as hf_greedy
        assert torch.equal(out.sequences, hf_greedy(target, prompt, 30)), name
        taus.append(out.stats.tau)
    if name in ("medusa", "distill"):  # trained drafts are accepted on the training prompts (off by one: ~1.1)
        assert sum(taus[:4]) / 4 > 1.5, taus


# ------------------------------------------------------------------------------------------------ alignment


def position_batch(hidden_size, *, layer=LAYERS, lengths=(9, 6), top_k=3, seed=0):
    """A right-padded batch whose feature at ``(b, t)`` is ``(t, b, 0, ..)`` (so an oracle can read its position)
    and whose labels are random: ``topk_ids[b, t]`` distinct ids, ``topk_logprobs`` sorted, real rows only."""
    generator = torch.Generator().manual_seed(seed)
    batch, width = len(lengths), max(lengths)
    real = torch.arange(width) < torch.tensor(lengths)[:, None]  # (B, T)
    features = torch.zeros(batch, width, 1, hidden_size)
    features[..., 0, 0] = torch.arange(width, dtype=torch.float32)
    features[..., 0, 1] = torch.arange(batch, dtype=torch.float32)[:, None]
    top_ids = torch.stack([torch.randperm(VOCAB, generator=generator)[:top_k] for _ in range(batch * width)])
    logprobs = torch.randn(batch * width, top_k, generator=generator).sort(-1, descending=True).values
    return FeatureBatch(
        input_ids=torch.randint(2, VOCAB, (batch, width), generator=generator) * real,
        attention_mask=real,
        assistant_mask=real & (torch.arange(width) >= 3),
        features=features,
        topk_ids=top_ids.view(batch, width, top_k) * real[..., None],
        topk_logprobs=logprobs.log_softmax(-1).view(batch, width, top_k).masked_fill(~real[..., None], -torch.inf),
        layers=(layer,),
    )


def decode_position(hidden):
    """(..., H) oracle states -> (t, b) long tensors (...)."""
    return hidden[..., 0].round().long(), hidden[..., 1].round().long()


def one_hot_logits(batch, t, b):
    """(..., V) logits that put all mass on the target's greedy token at position ``t`` of row ``b``."""
    width = batch.input_ids.shape[1]
    label = batch.topk_ids[b, t.clamp(0, width - 1), 0]
    return torch.nn.functional.one_hot(label, VOCAB).float() * 50.0


@pytest.mark.parametrize("loss_on", ["all", "assistant"])
@pytest.mark.parametrize("shift", [0, -1, 1])
def test_medusa_head_k_is_labelled_by_position_t_plus_k(target, loss_on, shift, monkeypatch):
    heads = MedusaHeads.from_target(target, num_heads=3)
    batch = position_batch(heads.config.hidden_size)

    def oracle(hidden):  # (N, H) -> (N, K, V): head k names the greedy token at t + k (+ shift)
        t, b = decode_position(hidden)
        return torch.stack([one_hot_logits(batch, t + k + shift, b) for k in range(1, 4)], dim=1)

    monkeypatch.setattr(heads, "forward", oracle)
    out = MedusaObjective(heads, num_target_layers=LAYERS, loss_on=loss_on, greedy=True)(batch)
    accuracies = [out.metrics[f"acc_{k}"] for k in range(1, 4)]
    if shift == 0:
        assert accuracies == [1.0, 1.0, 1.0] and out.metrics["loss"] < 1e-6
    else:
        assert max(accuracies) < 1.0 and out.metrics["loss"] > 1.0


@pytest.mark.parametrize("loss_on", ["all", "assistant"])
def test_medusa_loss_matches_a_per_position_reference(target, loss_on):
    torch.manual_seed(0)
    heads = MedusaHeads.from_target(target, num_heads=3)
    batch = position_batch(heads.config.hidden_size)
    batch = dataclasses.replace(batch, features=torch.randn(batch.features.shape) * batch.attention_mask[..., None,
                                                                                                         None])
    out = MedusaObjective(heads, num_target_layers=LAYERS, loss_on=loss_on, head_decay=0.5)(batch)
    width = batch.input_ids.shape[1]
    total = 0.0
    with torch.no_grad():
        for k in range(1, 4):
            terms = []
            for b in range(batch.input_ids.shape[0]):
                for t in range(width - k):
                    label = t + k  # head k at t drafts the token at t + 1 + k: the target's prediction at t + k
                    labelled = batch.attention_mask[b, label] and (
                        loss_on == "all" or (label + 1 < width and batch.assistant_mask[b, label + 1]))
                    if labelled:
                        logq = heads(batch.features[b, t, 0][None])[0, k - 1].log_softmax(-1)
                        p = batch.topk_logprobs[b, label].softmax(-1)
                        terms.append(-(p * logq[batch.topk_ids[b, label]]).sum())
            reference = torch.stack(terms).mean()
            assert out.metrics[f"loss_{k}"] == pytest.approx(float(reference), rel=1e-5)
            total += 0.5 ** (k - 1) * float(reference)
    assert float(out.loss.detach()) == pytest.approx(total, rel=1e-5)


def test_medusa_with_the_target_head_trains_only_its_own_blocks(target):
    heads = MedusaHeads.from_target(target, num_heads=2, share_target_head=True)
    objective = MedusaObjective(heads, num_target_layers=LAYERS)
    own = {id(p) for p in heads.parameters()}
    assert {id(p) for p in objective.parameters()} == own
    assert id(target.get_output_embeddings().weight) not in own
    batch = position_batch(heads.config.hidden_size)
    objective(dataclasses.replace(batch, features=torch.randn(batch.features.shape))).loss.backward()
    assert all(p.grad is not None for p in objective.parameters())
    target.zero_grad(set_to_none=True)  # the shared LM head was used by reference (and received a gradient)


def test_medusa_rejects_bad_arguments_and_mismatched_features(target):
    heads = MedusaHeads.from_target(target, num_heads=2)
    with pytest.raises(ValueError, match="num_target_layers"):
        MedusaObjective(heads, num_target_layers=0)
    with pytest.raises(ValueError, match="head_decay"):
        MedusaObjective(heads, num_target_layers=LAYERS, head_decay=0.0)
    with pytest.raises(ValueError, match="loss_on"):
        MedusaObjective(heads, num_target_layers=LAYERS, loss_on="prompt")
    with pytest.raises(ValueError, match="hidden size 16"):
        MedusaObjective(heads, num_target_layers=LAYERS)(position_batch(16))
    with pytest.raises(ValueError, match="layer 2 is not in the feature cache"):
        MedusaObjective(heads, num_target_layers=LAYERS)(position_batch(32, layer=1))


def test_distilling_the_target_into_itself_is_exact_and_shifted_labels_are_not(target, dataset):
    batch = dataset.load(dataset.batches(0)[0])
    assert batch.attention_mask.sum(1).unique().numel() > 1  # right padding is exercised
    with torch.no_grad():
        out = DistillObjective(target)(batch)
        shifted = DistillObjective(target)(dataclasses.replace(batch, topk_ids=batch.topk_ids.roll(1, dims=1)))
    real = batch.attention_mask
    p = batch.topk_logprobs[real].softmax(-1)  # (N, K)
    cross_entropy = -(p * batch.topk_logprobs[real]).sum(-1).mean()  # the student's log q are the cached ones
    assert out.metrics["acc_1"] == 1.0
    assert out.metrics["loss"] == pytest.approx(float(cross_entropy), rel=1e-4)
    assert shifted.metrics["acc_1"] < 0.5


def test_distill_vocabulary_checks(target, dataset):
    batch = dataset.load(dataset.batches(0)[0])
    wide = tiny_causal_lm("llama", seed=1, vocab=VOCAB + 31)  # a padded vocabulary: extra logits past the target's
    sliced, whole = DistillObjective(wide, vocab_size=VOCAB), DistillObjective(wide)
    before = sliced(batch).metrics["loss"], whole(batch).metrics["loss"]
    with torch.no_grad():
        wide.get_output_embeddings().weight[VOCAB:] = 5.0  # the padded ids take most of the mass
    after = sliced(batch).metrics["loss"], whole(batch).metrics["loss"]
    assert after[0] == pytest.approx(before[0], rel=1e-6) and after[1] > before[1] + 1.0
    narrow = tiny_causal_lm("llama", seed=1, vocab=64)
    with pytest.raises(ValueError, match="token id .* only 64 token ids"):
        DistillObjective(narrow)(batch)
    with pytest.raises(ValueError, match="loss_on"):
        DistillObjective(narrow, loss_on="prompt")
    with pytest.raises(ValueError, match="vocab_size"):
        DistillObjective(narrow, vocab_size=0)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        DistillObjective(torch.nn.Linear(2, 2))


def unrolled_oracle(name, target, batch, shift, monkeypatch):
    """An MTP or EAGLE-1 objective whose head passes states through with their position + 1, checks that the token
    fed with the state of position ``t`` is ``x_{t+1}``, and names the greedy token of the position its output
    state encodes (+ ``shift``)."""
    width = batch.input_ids.shape[1]
    fed = []

    def step(hidden, tokens):
        t, b = decode_position(hidden)
        following = (t + 1).clamp(max=width - 1)
        real = batch.attention_mask[b, following] & (t + 1 < width)
        fed.append(bool(((tokens == batch.input_ids[b, following]) | ~real).all()))
        moved = hidden.clone()
        moved[..., 0] += 1  # the exact feature of the next position
        return moved

    def logits(states):
        t, b = decode_position(states)
        return one_hot_logits(batch, t + shift, b)

    if name == "mtp":
        head = MTPHead.from_target(target)
        monkeypatch.setattr(head, "forward", lambda hidden, tokens, **_: step(hidden, tokens))
        monkeypatch.setattr(head, "logits", logits)
        return MTPObjective(head, num_target_layers=LAYERS, greedy=True), fed
    head = EagleHead.from_target(target, version=1)

    def forward(tokens, hidden, **_):
        moved = step(hidden, tokens)
        return EagleOutput(hidden=moved, draft_logits=logits(moved))

    monkeypatch.setattr(head, "forward", forward)
    return EagleObjective(head, steps=3, greedy=True), fed


@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("name", ["mtp", "eagle1"])
def test_unrolled_step_k_is_labelled_by_position_i_plus_k_plus_1(target, name, shift, monkeypatch):
    batch = position_batch(32)
    objective, fed = unrolled_oracle(name, target, batch, shift, monkeypatch)
    out = objective(batch)
    accuracies = [out.metrics[f"acc_{k}"] for k in range(1, 4)]
    assert fed == [True] * 3  # step k of chain i was fed x_{i+k+1}
    if shift == 0:  # EAGLE-1's feature regression is exact too: predicted state k is the real feature at i+k+1
        assert accuracies == [1.0, 1.0, 1.0] and out.metrics["loss"] < 1e-6
    else:
        assert max(accuracies) < 1.0 and out.metrics["loss"] > 1.0


def test_align_drops_misaligned_chains_from_later_depths_and_chain_counts_whole_matches(target, monkeypatch):
    """An oracle head that is right on every chain starting at an odd position and wrong on every other one: with
    ``align`` depths 2 and 3 train only on the aligned (odd) chains, so their loss vanishes; without it they do not.
    ``chain_k`` is the fraction of chains whose first k greedy tokens all match, here the odd ones."""
    batch = position_batch(32)
    width = batch.input_ids.shape[1]
    batch.features[..., 0, 2] = torch.arange(width, dtype=torch.float32)  # each chain carries its start position
    outputs = {}
    for align in (False, True):
        head = EagleHead.from_target(target, version=1)

        def forward(tokens, hidden, **_):
            moved = hidden.clone()
            moved[..., 0] += 1  # the next position's exact feature
            t, b = decode_position(moved)
            logits = one_hot_logits(batch, t, b)
            wrong = hidden[..., 2].round().long() % 2 == 0  # chains starting at even positions miss every depth
            return EagleOutput(hidden=moved, draft_logits=torch.where(wrong[..., None], logits.roll(1, -1), logits))

        monkeypatch.setattr(head, "forward", forward)
        outputs[align] = EagleObjective(head, steps=3, greedy=True, feature_weight=0.0, align=align)(batch).metrics
    plain, aligned = outputs[False], outputs[True]
    assert plain["loss_1"] == pytest.approx(aligned["loss_1"]) and plain["loss_1"] > 1.0  # depth 1: every chain
    assert plain["loss_2"] > 1.0 and plain["loss_3"] > 1.0
    assert aligned["loss_2"] < 1e-6 and aligned["loss_3"] < 1e-6  # misaligned chains no longer pull the head
    for k in (1, 2, 3):
        valid = batch.attention_mask[:, k:]  # (B, T - k) chains i whose label position i + k is real
        starts = torch.arange(width - k)
        expected = float((valid & (starts % 2 == 1)).sum()) / float(valid.sum())
        assert plain[f"chain_{k}"] == pytest.approx(expected) == aligned[f"chain_{k}"]
        assert plain[f"acc_{k}"] == pytest.approx(expected)  # right exactly where the chain is right
