"""Grammar-constrained speculation (specprim.constraints, docs/structured.md): outputs follow the grammar whatever the
drafter proposes, greedy output equals constrained greedy decoding, the first two tokens are distributed as
constrained sampling from the target (chi-square), and the same check rejects a loop that masks p but not q."""

import dataclasses
import json
import sys

import pytest
import torch
from _tiny import tiny_causal_lm
from transformers import LogitsProcessor, LogitsProcessorList

import specprim._constrain
from specprim import DraftTree, Verdict, speculative_generate
from specprim._constrain import prune_tree, unprune_verdict
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.constraints import GrammarConstraint
from specprim.drafters import ModelDrafter
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree, StaticTree

xgr = pytest.importorskip("xgrammar")

# A vocabulary of JSON pieces for tiny random models: id -> token text; <eos> (1) ends the output.
JSON_VOCAB = ["<pad>", "<eos>", "{", "}", '"ok"', ":", " ", "true", "false", ",", '"n"', "0", "1", "2", "7", '"',
              "x", '{"', 'ok":', "tr", "ue"]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
          "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": False}
PROMPT = torch.tensor([[2, 3, 4]])


def peaked(seed: int, vocab: int) -> torch.nn.Module:
    """A tiny random model whose next-token distributions are far from uniform."""
    model = tiny_causal_lm("llama", seed=seed, vocab=vocab, layers=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return model


JSON_TARGET, JSON_DRAFT = peaked(0, len(JSON_VOCAB)), peaked(1, len(JSON_VOCAB))
JSON = GrammarConstraint.json_schema(SCHEMA, JSON_VOCAB, stop_token_ids=[1])


def text(tokens: list[int]) -> str:
    return "".join(JSON_VOCAB[token] for token in tokens if token != 1)


def valid(obj: object) -> bool:
    return (isinstance(obj, dict) and set(obj) == {"ok", "n"} and isinstance(obj["ok"], bool)
            and type(obj["n"]) is int and 0 <= obj["n"] <= 9)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(depth=3, top_k=2, budget=6)], ids=["chain", "tree"])
def test_every_output_parses_and_follows_the_schema_whatever_the_drafter_proposes(tree, temperature):
    for seed in range(3):
        out = speculative_generate(JSON_TARGET, PROMPT, drafter=ModelDrafter(JSON_DRAFT, tree),
                                   acceptance=SpeculativeSampling(), max_new_tokens=40, temperature=temperature,
                                   generator=torch.Generator().manual_seed(seed), constraint=JSON, eos_token_id=1)
        new = out.sequences[0, PROMPT.shape[1]:].tolist()
        assert new[-1] == 1 and valid(json.loads(text(new))), text(new)
        # Unconstrained, the same models write no JSON at all.
        free = speculative_generate(JSON_TARGET, PROMPT, drafter=ModelDrafter(JSON_DRAFT, tree),
                                    acceptance=SpeculativeSampling(), max_new_tokens=40, temperature=temperature,
                                    generator=torch.Generator().manual_seed(seed), eos_token_id=1)
        assert not text(free.sequences[0, PROMPT.shape[1]:].tolist()).startswith("{")


class GrammarMask(LogitsProcessor):
    """Constrained decoding for ``model.generate``, straight on xgrammar: disallowed logits become -inf."""

    def __init__(self, compiled, prompt_length: int, vocab_size: int):
        self.matcher, self.start, self.vocab_size = xgr.GrammarMatcher(compiled), prompt_length, vocab_size

    def __call__(self, input_ids, scores):
        for token in input_ids[0, self.start:].tolist():
            assert self.matcher.accept_token(token)
        self.start = input_ids.shape[1]
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(scores, bitmask)
        return scores


@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(depth=3, top_k=2, budget=6)], ids=["chain", "tree"])
def test_greedy_equals_constrained_greedy_decoding(tree):
    for prompt in (PROMPT, torch.tensor([[5, 9, 1, 16]])):
        mask = GrammarMask(JSON.compiled, prompt.shape[1], len(JSON_VOCAB))
        expected = JSON_TARGET.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                        max_new_tokens=40, eos_token_id=1, pad_token_id=0,
                                        logits_processor=LogitsProcessorList([mask]))
        out = speculative_generate(JSON_TARGET, prompt, drafter=ModelDrafter(JSON_DRAFT, tree), acceptance=Greedy(),
                                   max_new_tokens=40, constraint=JSON, eos_token_id=1)
        assert out.sequences.tolist() == expected.tolist()


# A grammar over a 6-token vocabulary whose allowed sets change after the first token.
SMALL_VOCAB = ["<pad>", "<eos>", "a", "b", "c", "d"]
SMALL_TARGET, SMALL_DRAFT = peaked(4, len(SMALL_VOCAB)), peaked(5, len(SMALL_VOCAB))
SMALL = GrammarConstraint.regex("[abd][bc]d*", SMALL_VOCAB, stop_token_ids=[1])
TRIALS = 300


def small_chi_square(drafter) -> float:
    return two_token_chi_square(SMALL_TARGET, torch.tensor([[2, 3]]), drafter=drafter,
                                acceptance=SpeculativeSampling(), sampling=SamplingConfig(temperature=1.0),
                                trials=TRIALS, constraint=SMALL)


@pytest.mark.parametrize("tree", [Chain(2), StaticTree(paths=((0,), (1,), (2,), (0, 0), (1, 0)),
                                                       sample_without_replacement=True)], ids=["iid-chain", "wor-tree"])
def test_first_two_tokens_are_distributed_as_constrained_sampling(tree):
    assert small_chi_square(ModelDrafter(SMALL_DRAFT, tree)) > 1e-3


def test_the_check_rejects_a_mask_applied_to_p_only(monkeypatch):
    monkeypatch.setattr(specprim._constrain, "mask_draft", lambda tree, masks: tree)  # q keeps disallowed mass
    assert small_chi_square(ModelDrafter(SMALL_DRAFT, Chain(2))) < 1e-6


def test_pruning_keeps_allowed_paths_their_q_rows_and_maps_the_verdict_back():
    q = torch.rand(1, 5, 6)
    tree = DraftTree(tokens=torch.tensor([[2, 4, 3, 5]]), parents=torch.tensor([-1, -1, 0, 2]), q=q, sampling="iid")
    pruned, kept = prune_tree(tree, torch.tensor([True, False, True, True]))
    assert kept.tolist() == [0, 2, 3] and pruned.parent_list == [-1, 0, 1]
    assert pruned.tokens.tolist() == [[2, 3, 5]] and torch.equal(pruned.q, q[:, [0, 1, 3, 4]])
    verdict = Verdict(path=torch.tensor([[0, 1, -1]]), num_accepted=torch.tensor([2]), next_token=torch.tensor([5]))
    assert unprune_verdict(verdict, kept).path.tolist() == [[0, 2, -1]]


def test_the_grammar_walk_prunes_disallowed_nodes_and_their_subtrees():
    state = SMALL.begin()  # after "": [abd] then [bc]
    tree = DraftTree(tokens=torch.tensor([[2, 4, 3, 2, 5]]), parents=torch.tensor([-1, -1, 0, 0, 1]))
    valid, masks = state.allowed(tree)
    assert valid.tolist() == [True, False, True, False, False]
    assert masks[0, 2:].tolist() == [True, True, False, True] and masks[1, 2:].tolist() == [False, True, True, False]
    assert valid.tolist() == state.allowed(tree)[0].tolist()  # the walk rolled the matcher back


def test_a_q_masked_and_renormalised_is_what_the_acceptance_rule_reads(monkeypatch):
    seen = []
    rule = SpeculativeSampling()

    def spy(p, tree, generator=None):
        seen.append(tree)
        return rule(p, tree, generator=generator)

    speculative_generate(SMALL_TARGET, torch.tensor([[2, 3]]), drafter=ModelDrafter(SMALL_DRAFT, Chain(2)),
                         acceptance=spy, max_new_tokens=3, temperature=1.0, constraint=SMALL,
                         generator=torch.Generator().manual_seed(0))
    first = seen[0]
    assert torch.allclose(first.q[0, 0].sum(), torch.tensor(1.0))
    assert float(first.q[0, 0, [0, 1, 4]].sum()) == 0.0  # root row: only a, b, d allowed


def test_bad_inputs_get_one_clear_line():
    cases = [
        (lambda: GrammarConstraint.json_schema("{not json", JSON_VOCAB, stop_token_ids=[1]), "not valid JSON"),
        (lambda: GrammarConstraint.json_schema({"type": "nonsense"}, JSON_VOCAB, stop_token_ids=[1]),
         "invalid json schema"),
        (lambda: GrammarConstraint.regex("zz", SMALL_VOCAB, stop_token_ids=[1]), "admits no output"),
        (lambda: GrammarConstraint.ebnf("root ::= ", SMALL_VOCAB, stop_token_ids=[1]), "invalid ebnf"),
        (lambda: GrammarConstraint.regex("a", SMALL_VOCAB), "needs stop_token_ids"),
    ]
    for build, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            build()
        assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match="tokenizer must be"):
        GrammarConstraint.regex("a", object())
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(SMALL_TARGET, torch.tensor([[2, 3], [3, 2]]), drafter=ModelDrafter(SMALL_DRAFT, Chain(2)),
                             acceptance=Greedy(), max_new_tokens=2, constraint=SMALL)


def test_missing_xgrammar_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError, match=r"pip install 'specprim\[structured\]'"):
        GrammarConstraint.regex("a", SMALL_VOCAB, stop_token_ids=[1])


def test_xgrammar_is_imported_only_when_a_grammar_is_built():
    import ast
    import inspect

    import specprim.constraints._grammar as grammar
    top_level = [node for node in ast.parse(inspect.getsource(grammar)).body
                 if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not [node for node in top_level if "xgrammar" in ast.unparse(node)]


def test_the_repr_says_which_grammar():
    assert repr(SMALL) == "GrammarConstraint(source=\"regex('[abd][bc]d*')\")"
    assert dataclasses.replace(SMALL).source == SMALL.source


@pytest.mark.parametrize("command", ["generate --prompt hi", "bench --target t --method hf --max-new-tokens 4 "
                                                            "--dataset json"])
def test_the_command_line_refuses_a_bad_schema_file_in_one_line(command, tmp_path, capsys):
    from specprim import cli

    not_an_object = tmp_path / "list.json"
    not_an_object.write_text("[1, 2]")
    broken = tmp_path / "broken.json"
    broken.write_text("{oops")
    for path, message in ((tmp_path / "missing.json", "no such file"), (not_an_object, "must be an object"),
                          (broken, "not valid JSON")):
        assert cli.main([*command.split(), "--json-schema", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    if command.startswith("generate"):
        schema = tmp_path / "schema.json"
        schema.write_text("{}")
        assert cli.main([*command.split(), "--json-schema", str(schema), "--regex", "a"]) == 2
        assert "exclude each other" in capsys.readouterr().err


def test_the_json_dataset_asks_for_the_shipped_schema():
    from pathlib import Path

    from specprim.bench._datasets import DATASETS, JSON_EXTRACTION_SCHEMA

    shipped = Path(__file__).parents[1] / "benchmarks" / "schemas" / "json-extraction.json"
    assert json.loads(shipped.read_text()) == dict(JSON_EXTRACTION_SCHEMA)
    questions = b'{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Again."]}\n'
    (prompt,) = DATASETS["json"].parse(questions)
    assert prompt.id == "json-81" and prompt.category == "writing" and len(prompt.turns) == 1
    assert json.dumps(dict(JSON_EXTRACTION_SCHEMA)) in prompt.turns[0] and "Write a poem." in prompt.turns[0]
    GrammarConstraint.json_schema(dict(JSON_EXTRACTION_SCHEMA), JSON_VOCAB, stop_token_ids=[1])  # compiles


def test_bench_methods_decode_under_the_constraint_plain_and_speculative_alike():
    from specprim.bench._methods import Decoding, HFGenerate, SpecprimGenerate
    from specprim.presets import Method

    decoding = Decoding(max_new_tokens=40, eos_token_id=1, constraint=JSON)
    plain = HFGenerate(model=JSON_TARGET).generate(PROMPT, decoding, seed=0).new_ids.tolist()
    method = Method(drafter=ModelDrafter(JSON_DRAFT, Chain(3)), acceptance=Greedy())
    speculative = SpecprimGenerate(target=JSON_TARGET, method=method).generate(PROMPT, decoding, seed=0)
    assert valid(json.loads(text(plain))) and speculative.new_ids.tolist() == plain


def test_a_constraint_for_another_vocabulary_is_refused():
    other = GrammarConstraint.regex("[abd][bc]d*", SMALL_VOCAB + ["e"], stop_token_ids=[1])
    with pytest.raises(ValueError, match="vocabulary has 6"):
        speculative_generate(SMALL_TARGET, torch.tensor([[2, 3]]), drafter=ModelDrafter(SMALL_DRAFT, Chain(2)),
                             acceptance=Greedy(), max_new_tokens=2, constraint=other)


def test_generation_stops_once_the_grammar_is_complete_without_an_eos_to_stop_on():
    out = speculative_generate(JSON_TARGET, PROMPT, drafter=ModelDrafter(JSON_DRAFT, Chain(4)), acceptance=Greedy(),
                               max_new_tokens=60, constraint=JSON, eos_token_id=None)
    new = out.sequences[0, PROMPT.shape[1]:].tolist()
    assert new[-1] == 1 and new.count(1) == 1 and len(new) < 60 and valid(json.loads(text(new)))
