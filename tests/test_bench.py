"""specprim.bench: the runner's order, the JSON schema, the identical flag and divergence check, the CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specprim import bench, cli, presets
from specprim._types import DraftTree, Verdict
from specprim.bench import Decoding, Generation, Prompt
from specprim.drafters import Datastore, PromptLookup

EOS = 1
PROMPTS = [Prompt(id="two-turns", turns=("w5 w6 w7 w8 w5 w6", "w9 w10 w9")), Prompt(id="one", turns=("w3 w4 w3",))]


def word_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    """Token ``i`` is the word ``w{i}``; id 0 is ``<unk>``, id 1 is ``<eos>`` (the tiny models' EOS)."""
    words = {"<unk>": 0, "<eos>": EOS, **{f"w{i}": i for i in range(2, vocab)}}
    backend = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


@dataclasses.dataclass
class FakeMethod:
    """Returns fixed tokens and logs ``(name, prompt length, budget)`` of every call into the shared ``log``."""

    name: str
    log: list
    tokens: tuple[int, ...] = (5, 6, 7)
    draft_modules: tuple = ()

    def generate(self, input_ids: torch.Tensor, decoding: Decoding, seed: int) -> Generation:
        self.log.append((self.name, input_ids.shape[1], decoding.max_new_tokens))
        return Generation(new_ids=torch.tensor(self.tokens[: decoding.max_new_tokens]), stats=None)


@dataclasses.dataclass(frozen=True)
class ConstantDrafter:
    """Always drafts the same chain: a deliberately bad drafter."""

    tokens: tuple[int, ...] = (7, 7, 7)

    def propose(self, request) -> DraftTree:
        k = min(len(self.tokens), request.max_depth)
        return DraftTree(tokens=torch.tensor([self.tokens[:k]]), parents=torch.arange(-1, k - 1))

    def observe(self, verdict) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class AcceptAll:
    """A broken rule: accepts every drafted token of a chain (not lossless)."""

    lossless = False

    def __call__(self, p, tree, generator=None) -> Verdict:
        n = tree.num_nodes
        return Verdict(path=torch.arange(n)[None], num_accepted=torch.tensor([n]), next_token=p[:, n].argmax(-1))


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama")


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def test_schedule_interleaves_methods_within_each_prompt_and_repeat():
    order = [(s.prompt, s.repeat, s.method) for s in bench.schedule(2, ["hf", "a", "b"], 2)]
    assert order[:6] == [(0, 0, "hf"), (0, 0, "a"), (0, 0, "b"), (0, 1, "hf"), (0, 1, "a"), (0, 1, "b")]
    assert len(order) == 12 and order[6] == (1, 0, "hf")


def test_measure_warms_up_then_runs_a_b_a_b_and_every_turn(target, tokenizer):
    log: list = []
    methods = {name: FakeMethod(name, log) for name in ("hf", "a", "b")}
    rows, summaries = bench.measure(target=target, tokenizer=tokenizer, prompts=PROMPTS, methods=methods,
                                    decoding=Decoding(max_new_tokens=3, eos_token_id=EOS), dataset="t", repeats=2,
                                    warmup_tokens=2)
    assert [(name, budget) for name, _, budget in log[:3]] == [("hf", 2), ("a", 2), ("b", 2)]  # warm-up
    timed = [name for name, _, _ in log[3:]]
    # prompt 0 has two turns: each method answers both before the next method runs
    assert timed[:12] == ["hf", "hf", "a", "a", "b", "b"] * 2
    assert timed[12:] == ["hf", "a", "b"] * 2
    second_turn_lengths = {length for name, length, _ in log[3:5]}
    assert len(second_turn_lengths) == 2  # turn 2's input holds turn 1 and its answer
    assert [r.method for r in rows[:3]] == ["hf", "a", "b"] and len(rows) == 12
    assert all(r.identical for r in rows) and [s.method for s in summaries] == ["hf", "a", "b"]


def test_measure_requires_the_baseline(target, tokenizer):
    with pytest.raises(ValueError, match="baseline"):
        bench.measure(target=target, tokenizer=tokenizer, prompts=PROMPTS, methods={"a": FakeMethod("a", [])},
                      decoding=Decoding(max_new_tokens=2), dataset="t")


REQUIRED_SUMMARY = {"method", "dataset", "tau", "speedup", "tokens_per_s", "identical", "accepted_per_step",
                    "acceptance_by_depth", "draft_ms_per_step", "verify_ms_per_step", "other_ms_per_step",
                    "target_forwards", "drafter_params", "drafter_param_bytes", "peak_extra_bytes"}
REQUIRED_ROW = {"method", "dataset", "prompt_id", "repeat", "new_tokens", "seconds", "tokens_per_s", "speedup",
                "tau", "accepted_per_step", "acceptance_by_depth", "target_forwards", "identical", "divergence"}


def test_run_writes_the_documented_json_and_lossless_greedy_is_identical(target, tokenizer, tmp_path):
    broken = presets.Method(drafter=ConstantDrafter(), acceptance=AcceptAll())
    results = bench.run(
        target=target, tokenizer=tokenizer, methods=["prompt-lookup", "hf-prompt-lookup"], prompts=PROMPTS,
        max_new_tokens=12, custom={"broken": broken}, json_path=tmp_path / "out.json", argv=["specprim", "bench"],
    )
    data = json.loads((tmp_path / "out.json").read_text())
    assert set(data) == {"schema_version", "results", "prompts", "tau_by_context", "meta"}
    assert [r["method"] for r in data["results"]] == ["hf", "prompt-lookup", "hf-prompt-lookup", "broken"]
    for summary in data["results"]:
        assert REQUIRED_SUMMARY <= set(summary)
    assert len(data["prompts"]) == 4 * len(PROMPTS)
    for row in data["prompts"]:
        assert REQUIRED_ROW <= set(row)
    meta = data["meta"]
    assert meta["command"] == ["specprim", "bench"] and meta["seeds"]["seed"] == 0
    assert {"torch", "transformers", "specprim"} <= set(meta["versions"])
    assert {"cpu", "cpu_count", "torch_threads", "gpus"} <= set(meta["hardware"])

    assert results.summary("hf").speedup == pytest.approx(1.0)
    lookup = results.summary("prompt-lookup")
    rows = [r for r in results.prompts if r.method == "prompt-lookup"]
    assert lookup.identical is True and lookup.steps == sum(r.steps for r in rows)
    assert lookup.tau == pytest.approx((sum(r.accepted for r in rows) + lookup.steps) / lookup.steps)
    assert lookup.tau > 1.0  # the repeating prompts give prompt lookup matches that the target accepts
    assert lookup.target_forwards == lookup.steps + 3  # one prefill per generated turn
    assert results.summary("hf").tokens_per_forward == pytest.approx(1.0)
    assert results.summary("hf-prompt-lookup").identical is True
    bad = results.summary("broken")
    assert bad.identical is False and bad.divergences.get("disagreement", 0) >= 1
    row = next(r for r in results.prompts if r.method == "broken" and not r.identical)
    assert row.divergence["kind"] == "disagreement"
    assert row.divergence["recomputed_argmax"] == row.divergence["reference_token"]
    assert "| prompt-lookup |" in results.markdown()


class FixedLogits(torch.nn.Module):
    """Stands in for a target: ``logits`` after any context, and bf16 weights (so the bf16 tolerance applies)."""

    def __init__(self, logits: list[float]):
        super().__init__()
        self.embed = torch.nn.Embedding(4, 2, dtype=torch.bfloat16)
        self.logits = torch.tensor(logits)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.logits.expand(1, input_ids.shape[1], -1)})


def test_divergence_within_bf16_rounding_is_numerical_otherwise_a_disagreement():
    assert bench.relative_tolerance(torch.bfloat16) == 2.0**-7
    near_tie = FixedLogits([10.0, 10.05, -3.0])  # |diff| 0.05 <= 2^-7 * 10.05
    verdict = bench.classify_divergence(near_tie, torch.tensor([[2, 3]]), 1, 0, turn=1, position=4)
    assert verdict.kind == "numerical" and verdict.recomputed_argmax == 1 and verdict.turn == 1
    clear = FixedLogits([10.0, 12.0, -3.0])
    assert bench.classify_divergence(clear, torch.tensor([[2, 3]]), 1, 0, turn=0, position=0).kind == "disagreement"
    assert bench.first_difference([torch.tensor([1, 2, 3])], [torch.tensor([1, 2, 4])]) == (0, 2)
    assert bench.first_difference([torch.tensor([1, 2])], [torch.tensor([1, 2])]) is None


def test_plots_are_written(target, tokenizer, tmp_path):
    results = bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=["w3 w4 w3 w4"],
                        max_new_tokens=6, plot_dir=tmp_path)
    for name in ("speedup.png", "acceptance_by_depth.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert results.summary("prompt-lookup").rows == 1


def test_custom_method_and_unknown_names(target, tokenizer):
    with pytest.raises(ValueError, match="unknown method"):
        bench.run(target=target, tokenizer=tokenizer, methods=["nope"], prompts=["w3"], max_new_tokens=2)
    with pytest.raises(ValueError, match="draft model"):
        bench.run(target=target, tokenizer=tokenizer, methods=["hf-assisted"], prompts=["w3"], max_new_tokens=2)
    draft = tiny_causal_lm("llama", seed=1)
    with pytest.raises(ValueError, match="'leviathan\\+prompt-lookup'.*greedy decoding only"):  # before any timing
        bench.run(target=target, tokenizer=tokenizer, draft=draft, methods=["leviathan+prompt-lookup"],
                  prompts=["w3"], max_new_tokens=2, temperature=1.0, tree="sampled:2")
    with pytest.raises(ValueError, match="'prompt-lookup'.*greedy decoding only"):
        bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=["w3"], max_new_tokens=2,
                  temperature=1.0, acceptance="greedy")
    assert set(presets.NAMES) <= set(bench.method_names())
    method = bench.build_method("prompt-lookup", bench.MethodContext(target=target, num_draft=3,
                                                                     acceptance="greedy"))
    assert method.method.drafter == PromptLookup(num_tokens=3) and type(method.method.acceptance).__name__ == "Greedy"


def test_cli_bench_on_a_saved_model(target, tokenizer, tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    target.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w3 w4 w3 w4"}\n{"turns": ["w5 w6", "w7"]}\n')
    out = tmp_path / "r.json"
    code = cli.main(["bench", "--target", str(model_dir), "--method", "prompt-lookup", "--prompts", str(prompts),
                     "--max-new-tokens", "5", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and "| prompt-lookup |" in printed and "command:" in printed
    data = json.loads(out.read_text())
    assert data["meta"]["settings"]["num_prompts"] == 2 and data["meta"]["command"]
    assert cli.main(["bench", "--target", str(model_dir), "--method", "prompt-lookup"]) == 2
    assert "specprim bench: error: missing --max-new-tokens" in capsys.readouterr().err


def test_every_method_without_a_trained_head_runs_and_is_lossless(target, tokenizer):
    draft = tiny_causal_lm("llama", seed=1)
    store = Datastore([[3, 4, 5, 3, 4], [4, 5, 6]])
    context = bench.MethodContext(target=target, draft=draft, num_draft=3, preset_options={"datastore": store})
    names = []
    for name in bench.method_names():  # presets added to presets.NAMES appear here without edits
        try:
            bench.build_method(name, context)
        except ValueError as error:
            assert "head" in str(error) or name.startswith("llama-cpp") or name in ("hf-unpacked", "hf-eager"), (
                name, error)
            continue
        names.append(name)
    assert {"hf", "hf-prompt-lookup", "hf-assisted", "leviathan", "prompt-lookup", "datastore"} <= set(names)
    results = bench.run(target=target, tokenizer=tokenizer, draft=draft, methods=names, prompts=PROMPTS[1:],
                        max_new_tokens=8, num_draft=3, datastore=store)
    assert [s.method for s in results.results] == names
    for summary in results.results:
        assert summary.identical, summary.method
    draft_size = sum(t.numel() for t in (*draft.parameters(), *draft.buffers()))
    assert results.summary("leviathan").drafter_params == draft_size
    assert results.summary("hf-assisted").drafter_params == draft_size
    assert results.summary("prompt-lookup").drafter_params == 0


def test_turns_keeps_the_first_turns_only(target, tokenizer):
    results = bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=PROMPTS,
                        max_new_tokens=4, turns=1)
    assert [row.turns for row in results.prompts] == [1] * (2 * len(PROMPTS))  # hf and prompt-lookup per prompt
    assert results.meta["settings"]["turns"] == 1
    with pytest.raises(ValueError, match="turns"):
        bench.run(target=target, tokenizer=tokenizer, methods=[], prompts=PROMPTS, max_new_tokens=4, turns=0)


def test_predict_adds_the_speedup_model_and_tree_replaces_the_presets_shape(target, tokenizer):
    draft = tiny_causal_lm("llama", seed=1)
    results = bench.run(target=target, tokenizer=tokenizer, draft=draft, methods=["leviathan"],
                        prompts=PROMPTS[1:], max_new_tokens=8, predict=True, tree="dynamic:depth=2,top_k=2,budget=3",
                        custom={"chain": presets.leviathan(draft, k=2)})
    tree_run = results.summary("leviathan")
    assert tree_run.predicted_tau >= 1.0 and tree_run.predicted_speedup > 0
    assert tree_run.achieved_over_predicted == pytest.approx(tree_run.speedup / tree_run.predicted_speedup)
    assert max(r.tau for r in results.prompts if r.method == "leviathan") <= 3.0  # depth 2 + the bonus
    assert results.summary("hf").predicted_speedup is None
    assert "achieved / predicted" in results.markdown() and results.meta["settings"]["predict"] is True
    without = bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=PROMPTS[1:],
                        max_new_tokens=4)
    assert "predicted" not in without.markdown()


def test_a_unions_heads_and_draft_models_count_as_its_parameters():
    """``modules_of`` reaches the modules of every part of a union (four attribute levels down), counted once."""
    from specprim.bench._methods import modules_of
    from specprim.drafters import EagleHead, MedusaHeads

    target = tiny_causal_lm("llama")
    eagle, medusa = EagleHead.from_target(target, version=3), MedusaHeads.from_target(target)
    union = presets.union(presets.eagle3(eagle), presets.medusa(medusa), presets.prompt_lookup())
    found = modules_of(union.drafter)
    assert any(m is eagle for m in found) and any(m is medusa for m in found)
    assert len({id(m) for m in found}) == len(found)
