"""specprim.train._campaign: a tiny campaign end to end, exact resumption after kills and budget stops, status,
the data order (skipped items, benchmark questions, held-out tail), bad inputs."""

import dataclasses
import json
import re
import shutil

import pytest
import torch
from _tiny import tiny_causal_lm
from safetensors.torch import load_file
from test_bench import word_tokenizer

from specprim import cli
from specprim.bench._prompts import Prompt
from specprim.drafters import EagleHead
from specprim.train import _campaign as _campaign_module
from specprim.train import _distill, _features
from specprim.train._campaign import (
    Campaign,
    CampaignData,
    CampaignHead,
    campaign_status,
    distill_order,
    format_status,
    plan_order,
    plan_shards,
    run_campaign,
    trim_conversation,
)
from specprim.train._objective import EagleObjective

CHATS = 26


def _conversation(generator, turns):
    out = []
    for _ in range(turns):
        words = [f"w{int(i)}" for i in torch.randint(4, 97, (7,), generator=generator)]
        out += [{"role": "user", "content": " ".join(words[:3])}, {"role": "assistant", "content": " ".join(words[3:])}]
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama target with a word-level chat tokenizer saved to a directory, and a JSONL of conversations with
    1 to 3 turns."""
    root = tmp_path_factory.mktemp("campaign")
    target = tiny_causal_lm("llama")
    tokenizer = word_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}w2 {{ m['content'] }} w3 {% endfor %}"
                               "{% if add_generation_prompt %}w2 {% endif %}")
    target.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    generator = torch.Generator().manual_seed(0)
    with open(root / "chats.jsonl", "w") as f:
        for i in range(CHATS):
            f.write(json.dumps(_conversation(generator, 1 + i % 3)) + "\n")
    return root


def _campaign(tiny, run_dir, **head):
    return Campaign(
        target=str(tiny / "model"), run_dir=str(run_dir), distill_dtype="float32", feature_dtype="float32",
        data=CampaignData(source=str(tiny / "chats.jsonl"), skip_first=2, exclude_benchmarks=(), holdout=3,
                          shard_sizes=(4, 6), max_turns=2, max_new_tokens=5, batch_size=2, max_length=40),
        head=CampaignHead(**{"draft_vocab_size": 48, "batch_tokens": 96, "segment_steps": 3, "checkpoint_every": 2,
                             "log_every": 1, "lr": 3e-3, "warmup_steps": 2, "milestones": (200, 500),
                             "max_train_tokens": 700, "mixed_precision": "no", **head}),
    )


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def whole(tiny):
    """An uninterrupted run of the tiny campaign."""
    campaign = _campaign(tiny, tiny / "whole")
    status = run_campaign(campaign, log=_quiet)
    return campaign, status


# Files that depend on timing, or that only the trainer appends to (a resumed trainer repeats the lines after its
# last checkpoint); everything else must be identical after any interruption.
VOLATILE = {"rates.json", "progress.json", "train/log.jsonl"}


def _files(run_dir):
    out = {}
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        name = str(path.relative_to(run_dir))
        if name in VOLATILE or name == "campaign.json":
            continue
        if path.suffix == ".safetensors":
            out[name] = {k: v.tolist() for k, v in load_file(str(path)).items()}
        elif name.endswith("trainer_state.json"):
            out[name] = {k: v for k, v in json.loads(path.read_text()).items() if k != "seconds"}
        else:
            out[name] = path.read_bytes()
    return out


def test_a_campaign_runs_to_the_end_and_reports_its_status(tiny, whole, capsys):
    campaign, status = whole
    run = tiny / "whole"
    order = json.loads((run / "order.json").read_text())
    assert min(order["train"] + order["holdout"]) >= 2  # skip_first
    assert order["holdout"] == [CHATS - 3, CHATS - 2, CHATS - 1]  # the tail is held out, never trained on
    assert not set(order["train"]) & set(order["holdout"])
    # shards of 4, 6, 6, ... conversations alternating greedy and sampled answers; the second pass answers each
    # conversation at the other temperature
    holdout, plan = plan_shards(order, campaign.data)
    per_pass = len(plan) // 2
    assert [len(s.items) for s in plan[:per_pass]] == [4, 6, 6][:per_pass - 1] + [len(plan[per_pass - 1].items)]
    assert [s.temperature for s in plan[:3]] == [0.0, 1.0, 0.0] and holdout.temperature == 0.0
    assert [s.items for s in plan[per_pass:]] == [s.items for s in plan[:per_pass]]
    assert [s.temperature for s in plan[per_pass:per_pass + 3]] == [1.0, 0.0, 1.0]
    shards = sorted(p.name for p in (run / "shards").iterdir() if p.name != "holdout")
    meta = [json.loads((run / "shards" / name / "distilled.json").read_text()) for name in shards]
    assert [m["temperature"] for m in meta] == [s.temperature for s in plan[: len(meta)]]
    assert [m["conversations"] for m in meta[:2]] == [4, 6]
    # first turns and continuations: every user turn (up to max_turns) is answered by the target
    source = [json.loads(line) for line in (tiny / "chats.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (run / "shards" / shards[0] / "distilled.jsonl").read_text().splitlines()]
    items = order["train"][:4]
    answered = [items[i] for i in distill_order([trim_conversation(source[i], campaign.data) for i in items])]
    for index, conversation in zip(answered, first, strict=True):  # shortest prompt first
        users = [m for m in source[index] if m["role"] == "user"][:2]
        assert [m for m in conversation if m["role"] == "user"] == users
        assert [m["role"] for m in conversation] == ["user", "assistant"] * len(users)
    assert not (run / "shards" / shards[0] / ".distilled.jsonl.partial").exists()
    # training reached the end, evaluated on the held-out shard, kept a head at each milestone
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert records[0]["segment"] == 0 and records[0]["trained_tokens"] == 0  # the initial head
    assert [r["segment"] for r in records] == list(range(len(records)))
    assert all({"acc_1", "acc_2", "acc_3"} <= set(r) for r in records)
    assert records[-1]["trained_tokens"] >= 700 and max(r["shards"] for r in records) >= 2
    for label, milestone in (("200", 200), ("500", 500)):
        snapshot = json.loads((run / "milestones" / label / "milestone.json").read_text())
        assert snapshot["trained_tokens"] >= milestone
        crossing = next(r for r in records if r["trained_tokens"] >= milestone)
        assert snapshot["step"] == crossing["step"]  # taken at the first evaluation past the milestone
        assert EagleHead.from_pretrained(run / "milestones" / label, tiny_causal_lm("llama")).config.version == 3
    # status: counts read back from the run directory
    assert campaign_status(run) == status
    assert status.trained_tokens == records[-1]["trained_tokens"]
    done = [name for name in shards if (run / "shards" / name / "cached.json").is_file()]
    assert status.shards_cached == len(done)
    assert status.cached_tokens == sum(json.loads((run / "shards" / n / "cached.json").read_text())["tokens"]
                                       for n in done)
    assert status.generated_tokens == sum(m["generated_tokens"] for m in meta[: status.shards_distilled])
    assert status.generated_tokens > 0 and status.evaluation == records[-1] and status.baseline == records[0]
    assert status.milestones_done == ("200", "500") and status.next_milestone is None and not status.data_exhausted
    assert cli.main(["campaign", "status", str(run)]) == 0
    text = capsys.readouterr().out
    assert f"trained:    {status.trained_tokens:,} tokens" in text
    assert f"generated:  {status.generated_tokens:,} tokens" in text
    assert "milestones: 200, 500 done" in text and "held-out:   top-1 by depth" in text


def test_a_killed_campaign_resumes_to_the_files_of_an_uninterrupted_run(tiny, whole, monkeypatch):
    campaign = _campaign(tiny, tiny / "killed")

    def crash_on_call(module, name, number):
        real, calls = getattr(module, name), []

        def crashing(*args, **kwargs):
            calls.append(1)
            if len(calls) == number:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, crashing)
        return lambda: monkeypatch.setattr(module, name, real)

    # each rerun is killed again: in self-distillation, feature caching, training steps and evaluations
    kills = [(_distill, "_rewrite", 4), (_features, "_shard_tensors", 2), (EagleObjective, "forward", 5),
             (_distill, "_rewrite", 2), (EagleObjective, "forward", 3), (EagleObjective, "forward", 2)]
    for module, name, number in kills:
        restore = crash_on_call(module, name, number)
        with pytest.raises(KeyboardInterrupt):
            run_campaign(campaign, log=_quiet)
        restore()
        partial = list((tiny / "killed" / "shards").glob("*/.distilled.jsonl.partial"))
        for path in partial:  # a kill in the middle of a line
            with open(path, "a") as f:
                f.write('[{"role": "user", "conte')
    final = run_campaign(campaign, log=_quiet)
    assert final.trained_tokens == whole[1].trained_tokens
    expected, got = _files(tiny / "whole"), _files(tiny / "killed")
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], name


def test_budget_stops_resume_exactly_and_status_counts_grow(tiny, whole):
    campaign = _campaign(tiny, tiny / "budget")
    trained, runs = [], 0
    while True:
        status = run_campaign(campaign, max_items=4, log=_quiet)
        runs += 1
        trained.append(status.trained_tokens)
        if status.trained_tokens >= campaign.head.train_tokens:
            break
        assert runs < 60
    assert runs > 3 and trained == sorted(trained)
    assert _files(tiny / "budget") == _files(tiny / "whole")
    short = run_campaign(_campaign(tiny, tiny / "short", milestones=(10**6,), max_train_tokens=None), log=_quiet)
    assert short.data_exhausted and short.eta_seconds is None and short.shards_cached == short.shards_planned
    assert short.trained_tokens >= 2 * short.cached_tokens  # every shard trained on
    assert "never: the data plan runs out first" in format_status(short)
    stopped = run_campaign(_campaign(tiny, tiny / "zero"), max_seconds=0, log=_quiet)
    assert stopped.generated_tokens == 0 and stopped.trained_tokens == 0  # no unit of work started
    assert "stopped" in format_status(stopped)


def test_compute_settings_follow_the_machine_and_may_change_on_resume(tiny, monkeypatch):
    """``auto`` runs in the machine's native dtype; each shard records the dtype it was made in; other dtypes,
    another self-distillation batch size or end on resume are saved and apply from then on, without retraining and
    keeping the answers already written (the other settings are refused, tested below)."""
    from specprim import models

    monkeypatch.setattr(models, "native_dtype", lambda: "float32")  # e.g. an AVX2-only CPU
    run = tiny / "dtypes"
    campaign = dataclasses.replace(_campaign(tiny, run), distill_dtype="auto", feature_dtype="auto")
    lines = []
    run_campaign(campaign, max_items=4, log=lines.append)  # the held-out shard (2 batches), its features, 1 batch
    assert json.loads((run / "shards" / "holdout" / "distilled.json").read_text())["dtype"] == "float32"
    assert json.loads((run / "shards" / "holdout" / "cached.json").read_text())["dtype"] == "float32"
    first_batch = (run / "shards" / "00000" / ".distilled.jsonl.partial").read_text().splitlines()
    assert len(first_batch) == campaign.data.batch_size
    moved = dataclasses.replace(campaign, feature_dtype="bfloat16",
                                data=dataclasses.replace(campaign.data, batch_size=3),
                                head=dataclasses.replace(campaign.head, mixed_precision="auto", max_train_tokens=900))
    for _ in range(4):  # unit by unit: the rest of shard 0's answers, then its features in bfloat16
        run_campaign(moved, max_items=1, log=lines.append)
    assert ("from now on feature_dtype: 'auto' -> 'bfloat16'; batch_size: 2 -> 3; mixed_precision: 'no' -> 'auto'; "
            "max_train_tokens: 700 -> 900 (what is done keeps its own)") in lines
    answered = (run / "shards" / "00000" / "distilled.jsonl").read_text().splitlines()
    assert answered[:2] == first_batch and len(answered) == 4
    assert json.loads((run / "campaign.json").read_text())["feature_dtype"] == "bfloat16"
    assert json.loads((run / "shards" / "00000" / "cached.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((run / "shards" / "holdout" / "cached.json").read_text())["dtype"] == "float32"
    assert not list(run.glob("retrained-*"))
    shutil.rmtree(run)


def test_a_higher_train_ratio_on_resume_trains_on_over_the_shards_it_has(tiny):
    """A campaign whose data plan ran out at one trained token per cached token, resumed at two: the head goes on
    from its checkpoint over the same shards (its evaluations so far kept, no retraining, no data made)."""
    run = tiny / "ratio"
    once = _campaign(tiny, run, train_ratio=1.0, milestones=(10**6,), max_train_tokens=None)
    first = run_campaign(once, log=_quiet)
    assert first.data_exhausted and first.trained_tokens < 2 * first.cached_tokens
    evaluations = (run / "eval.jsonl").read_text().splitlines()
    lines = []
    twice = dataclasses.replace(once, head=dataclasses.replace(once.head, train_ratio=2.0))
    second = run_campaign(twice, log=lines.append)
    assert "from now on train_ratio: 1.0 -> 2.0 (what is done keeps its own)" in lines
    assert second.data_exhausted and second.trained_tokens >= 2 * second.cached_tokens
    assert (second.generated_tokens, second.cached_tokens) == (first.generated_tokens, first.cached_tokens)
    assert second.step > first.step
    assert (run / "eval.jsonl").read_text().splitlines()[: len(evaluations)] == evaluations
    assert json.loads((run / "campaign.json").read_text())["head"]["train_ratio"] == 2.0
    assert not list(run.glob("retrained-*"))
    shutil.rmtree(run)


def test_order_skips_the_first_items_benchmark_questions_and_long_prompts(monkeypatch):
    data = CampaignData(skip_first=1, holdout=1, max_turns=2, max_prompt_chars=100, exclude_benchmarks=("mt-bench",))
    question = "compose an engaging travel blog post about a recent trip to hawaii highlighting culture"

    def chat(*users):
        return [m for u in users for m in ({"role": "user", "content": u}, {"role": "assistant", "content": "ok"})]

    conversations = [chat("skipped"), chat("fine"), chat(f"Please: {question}!"), chat("x" * 101), chat("a", "b", "c"),
                     chat("d", "y" * 101), chat("e"), *[chat(f"near {i}") for i in range(10)], chat("tail")]
    from specprim.bench import _datasets

    monkeypatch.setattr(_datasets, "load_dataset", lambda name: [Prompt(id="0", turns=(question.title(),))])
    from specprim.train._campaign import benchmark_shingles

    order = plan_order(conversations, data, benchmark_shingles(data.exclude_benchmarks))
    assert order["holdout"] == [17] and order["benchmark_overlaps"] == 1
    # not 0 (skipped), 2 (a benchmark question), 3 (too long), 7-16 (the 10 items just before the held-out ones)
    assert sorted(order["train"]) == [1, 4, 5, 6]
    assert trim_conversation(conversations[4], data) == chat("a", "b")  # max_turns
    assert trim_conversation(conversations[5], data) == chat("d")  # cut before the long turn
    assert order == plan_order(conversations, data, benchmark_shingles(data.exclude_benchmarks))
    assert plan_order(conversations, CampaignData(skip_first=1, holdout=1, seed=1, max_prompt_chars=100),
                      set())["train"] != order["train"]


def test_bad_inputs_give_a_one_line_error(tiny, capsys):
    for make in (lambda: CampaignData(shard_sizes=()), lambda: CampaignData(holdout=0),
                 lambda: CampaignData(temperatures=(0.0,), passes=2), lambda: CampaignHead(milestones=(2, 1)),
                 lambda: CampaignHead(lr=0), lambda: Campaign(target="m", run_dir="r", distill_dtype="fp16"),
                 lambda: Campaign(target="m", run_dir="r", head=CampaignHead(batch_tokens=16))):
        with pytest.raises(ValueError) as error:
            make()
        assert "\n" not in str(error.value)
    capsys.readouterr()
    assert cli.main(["campaign", "status", str(tiny / "nowhere")]) == 2  # usage errors
    assert re.match(r"^specprim campaign status: error: no campaign in .*campaign.json missing",
                    capsys.readouterr().err)
    assert cli.main(["campaign", "run", str(tiny / "bad"), "--shard-sizes", "0"]) == 2
    assert "specprim campaign run: error: shard_sizes must be" in capsys.readouterr().err
    assert cli.main(["campaign", "run", str(tiny / "bad"), "--holdout", "many"]) == 2
    assert "cannot read an option value" in capsys.readouterr().err
    run = tiny / "cli"
    common = ["--target", str(tiny / "model"), "--data", str(tiny / "chats.jsonl"), "--skip-first", "2",
              "--exclude-benchmarks", "", "--holdout", "3", "--shard-sizes", "4", "--max-turns", "1",
              "--max-new-tokens", "3", "--distill-batch-size", "2", "--max-length", "40", "--batch-tokens", "96",
              "--draft-vocab-size", "48", "--distill-dtype", "float32", "--feature-dtype", "float32",
              "--mixed-precision", "no"]  # accelerate's state is global: the other tests' precision
    assert cli.main(["campaign", "run", str(run), *common, "--max-items", "1"]) == 0
    assert "generated:  " in capsys.readouterr().out
    saved = json.loads((run / "campaign.json").read_text())
    assert saved["data"]["shard_sizes"] == [4] and saved["head"]["draft_vocab_size"] == 48
    assert cli.main(["campaign", "run", str(run)]) == 0  # resumes with the saved settings, to the end of the data
    capsys.readouterr()
    assert cli.main(["campaign", "run", str(run), "--lr", "1e-3"]) == 2  # refused before anything loads
    assert re.search(r"other settings \(lr: 0.0003 -> 0.001\); retrain \(--retrain\)", capsys.readouterr().err)
    assert cli.main(["campaign", "run", str(run), "--max-length", "50", "--retrain"]) == 2
    assert re.search(r"other settings \(max_length: 40 -> 50\); use another run directory", capsys.readouterr().err)
    data = {p: p.read_bytes() for p in (run / "shards").rglob("*") if p.is_file()}
    old_eval = (run / "eval.jsonl").read_text()
    assert cli.main(["campaign", "run", str(run), "--lr", "1e-3", "--retrain", "--max-items", "1"]) == 0
    assert (run / "retrained-1" / "eval.jsonl").read_text() == old_eval
    assert (run / "retrained-1" / "train" / "head" / "model.safetensors").is_file()
    assert json.loads((run / "retrained-1" / "campaign.json").read_text())["head"]["lr"] == 3e-4
    assert json.loads((run / "campaign.json").read_text())["head"]["lr"] == 1e-3
    assert {p: p.read_bytes() for p in (run / "shards").rglob("*") if p.is_file()} == data  # the data is kept
    records = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert records[0]["segment"] == 0 and records[0] == json.loads(old_eval.splitlines()[0])  # the same start
    assert [r["segment"] for r in records] == [0, 1]  # one segment of the new training so far
    shutil.rmtree(run)


def _first_users(path):
    conversations = map(json.loads, path.read_text().splitlines())
    return [next(m["content"] for m in c if m["role"] == "user") for c in conversations]


def test_shards_are_answered_shortest_prompt_first_and_an_unsorted_partial_file_goes_on_unsorted(tiny, whole,
                                                                                                 monkeypatch):
    """Batches stay full and pad their prompts to about one length: each shard is answered (and written) by number
    of turns, then shortest prompt first; a partial file begun in the shard's own order (an earlier version) is
    completed in that order."""
    campaign, _ = whole
    source = [json.loads(line) for line in (tiny / "chats.jsonl").read_text().splitlines()]
    holdout, shards = plan_shards(json.loads((tiny / "whole" / "order.json").read_text()), campaign.data)
    lengths = set()
    for shard in [holdout, *shards]:
        path = tiny / "whole" / "shards" / shard.name / "distilled.jsonl"
        if not path.is_file():
            continue  # the campaign ended before this shard
        sizes = [(sum(m["role"] == "user" for m in c), sum(len(m["content"]) for m in c if m["role"] == "user"))
                 for c in map(json.loads, path.read_text().splitlines())]
        assert sizes == sorted(sizes)  # by turns, then characters
        lengths |= set(sizes)
        items = [trim_conversation(source[i], campaign.data) for i in shard.items]
        assert sorted(_first_users(path)) == sorted(c[0]["content"] for c in items)
    assert len(lengths) > 3
    chats = [[{"role": "user", "content": "x" * n}, {"role": "assistant", "content": "a"}] for n in (5, 2, 9, 2)]
    chats[2] = chats[2] + chats[1]  # two turns
    assert distill_order(chats) == [1, 3, 0, 2]
    assert distill_order(chats, chats[1:2]) == [1, 3, 0, 2]
    assert distill_order(chats, chats[:2]) == [0, 1, 2, 3]
    chats[0] = chats[1] + chats[1]
    assert distill_order(chats) == [1, 3, 0, 2]  # the two-turn chats last, the shorter first
    for written in (chats[2:3], chats + chats[:1]):
        with pytest.raises(ValueError, match="holds conversations of another shard"):
            distill_order(chats, written)

    run = tiny / "legacy"
    legacy = _campaign(tiny, run)
    monkeypatch.setattr(_campaign_module, "distill_order", lambda conversations, written=(): list(
        range(len(conversations))))
    run_campaign(legacy, max_items=4, log=_quiet)  # the held-out shard (2 batches), its features, 1 batch of shard 0
    assert len(_first_users(run / "shards" / "00000" / ".distilled.jsonl.partial")) == campaign.data.batch_size
    monkeypatch.undo()
    run_campaign(legacy, max_items=3, log=_quiet)  # the rest of shard 0
    items = [trim_conversation(source[i], campaign.data) for i in shards[0].items]
    assert _first_users(run / "shards" / "00000" / "distilled.jsonl") == [c[0]["content"] for c in items]
    shutil.rmtree(run)


def test_a_campaign_on_the_sources_answers_keeps_them_and_holds_out_the_targets(tiny, whole, capsys):
    """answers='source': training shards are the trimmed source conversations (nothing generated), the held-out
    shard is still the target's greedy answers (the same as a self-distilling campaign's), the head grows to two
    layers and trains."""
    run = tiny / "source"
    campaign = _campaign(tiny, run, head_layers=2, max_train_tokens=300, milestones=(200,))
    campaign = Campaign(**{**campaign.__dict__, "data": CampaignData(**{**campaign.data.__dict__, "answers": "source",
                                                                          "passes": 1})})
    status = run_campaign(campaign, log=_quiet)
    order = json.loads((run / "order.json").read_text())
    source = [json.loads(line) for line in (tiny / "chats.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in (run / "shards" / "00000" / "distilled.jsonl").read_text().splitlines()]
    assert kept == [trim_conversation(source[i], campaign.data) for i in order["train"][:4]]
    meta = json.loads((run / "shards" / "00000" / "distilled.json").read_text())
    assert meta["answers"] == "source" and meta["generated_tokens"] == 0 and meta["source_tokens"] > 0
    held_out = (run / "shards" / "holdout" / "distilled.jsonl").read_text()
    assert held_out == (tiny / "whole" / "shards" / "holdout" / "distilled.jsonl").read_text()
    assert held_out != "".join(json.dumps(trim_conversation(source[i], campaign.data)) + "\n"
                               for i in order["holdout"])
    assert status.generated_tokens == 0 and status.source_tokens >= meta["source_tokens"]
    assert status.trained_tokens >= 300
    head = EagleHead.from_pretrained(run / "milestones" / "200", tiny_causal_lm("llama"))
    assert head.config.num_layers == 2
    assert cli.main(["campaign", "status", str(run)]) == 0
    assert f"answers:    the source's own, {status.source_tokens:,} tokens" in capsys.readouterr().out
    with pytest.raises(ValueError, match="answers must be 'target' or 'source'"):
        CampaignData(answers="teacher")
    with pytest.raises(ValueError, match="would cache the same conversations again"):
        CampaignData(answers="source", passes=2)
    with pytest.raises(ValueError, match="head_layers must be >= 1"):
        CampaignHead(head_layers=0)


def test_rates_are_recent_and_the_eta_counts_the_data_still_to_make():
    from specprim.train._campaign import _eta, _rate

    assert _rate({"tokens": 10, "seconds": 100.0, "recent": [[50, 1.0], [150, 1.0]]}) == 150.0  # half the tokens
    assert _rate({"tokens": 100, "seconds": 50.0}) == 2.0 and _rate({}) is None
    # a unit that ran while the job was stopped (100 tokens in 1,000 s) leaves the rate of the others
    assert _rate({"recent": [[100, 1.0], [100, 1000.0], [120, 1.0], [110, 1.0]]}) == 110.0
    assert _rate({"recent": [[0, 0.0]]}) is None
    rates = {"distill": 10.0, "cache": 100.0, "train": 50.0}
    assert _eta(100, 200, 2.0, 0.5, rates) == 2.0  # trainable on the data already cached
    # 100 more trained tokens need 50 more cached tokens: 25 generated at 10 tok/s, cached at 100 tok/s
    assert _eta(100, 0, 2.0, 0.5, rates) == pytest.approx(2.0 + 50 * (0.5 / 10 + 1 / 100))
    assert _eta(100, 0, 2.0, 0.5, {**rates, "distill": None}) is None
    assert _eta(100, 0, 2.0, 0.0, {**rates, "distill": None}) == pytest.approx(2.0 + 50 / 100)  # nothing to generate


def test_adapt_threads_leaves_the_cpus_other_processes_keep_busy(monkeypatch, capsys):
    from specprim.train import _campaign

    before = torch.get_num_threads()
    try:
        hook = _campaign.adapt_threads(2, log=_quiet)
        for busy, threads in ((0.1, 2), (1.2, 1), (1.9, 1), (None, 2), (0.4, 2)):
            monkeypatch.setattr(_campaign, "_busy_cpus", lambda interval, busy=busy: busy)
            hook()
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    busy = _campaign._busy_cpus(0.05)
    assert busy is None or 0 <= busy <= (__import__("os").cpu_count() or 1) + 1e-6
    assert cli.main(["campaign", "run", "unused", "--threads", "two"]) == 2
    assert "--threads must be a number >= 1 or 'auto'" in capsys.readouterr().err


def test_status_says_when_the_process_of_the_stage_is_gone_or_stopped():
    import os
    import signal
    import subprocess
    import time

    from specprim.train._campaign import _process_note

    assert _process_note(os.getpid()) == "" and _process_note(None) == ""
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        child_state = ""
        for _ in range(100):  # the stop is delivered asynchronously
            child_state = _process_note(child.pid)
            if child_state:
                break
            time.sleep(0.01)
        assert f"process {child.pid} is stopped (`kill -CONT {child.pid}` continues it)" in child_state
    finally:
        child.kill()
        child.wait()
    assert "is not running" in _process_note(child.pid)
