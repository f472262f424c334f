"""A fuzzed generation loop: hypothesis generates drafters (random tree shapes, each sampling scheme with an honest
``q``, random EOS placements, budgets and batch rows) and runs them through every verifier (eager ``HFTarget``,
``StaticTarget(compile=False)`` and the batched verifier) on tiny random models. Properties: greedy output equals
``model.generate``'s, the statistics add up, and sampled output follows the target's distribution. Broken variants
(a verifier that skips a cache step, a drafter whose ``q`` lies) are caught.

CI runs a bounded number of examples; ``SPECPRIM_FUZZ_EXAMPLES=500 python -m pytest -m fuzz`` runs many more."""

import os
import re

import pytest
import torch
from _tiny import tiny_causal_lm
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specprim import DraftTree, speculative_generate
from specprim._types import SAMPLING_SCHEMES, children_of
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.hf import HFTarget, StaticTarget
from specprim.sampling import SamplingConfig
from specprim.testing import TableDraftModel, compare, draw_siblings, exact_two_token_distribution, trees

EXAMPLES = int(os.environ.get("SPECPRIM_FUZZ_EXAMPLES", "0"))  # 0: the bounded CI run
FUZZ = settings(max_examples=EXAMPLES or 40, deadline=None, derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SAMPLED = settings(FUZZ, max_examples=EXAMPLES or 2)

VOCAB = 11  # small, so drafts and EOS placements get hit often
ARCHS = ("llama", "qwen2")


def context_sensitive(model: torch.nn.Module) -> torch.nn.Module:
    """Scale up the attention weights of a tiny random model: at initialisation its next token depends on little
    but the last token, so a cache bug would rarely change the output; scaled, every cache entry counts."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if re.search(r"\.(q_proj|k_proj)\.weight$", name):
                parameter.mul_(QK_SCALE)
            if re.search(r"\.(v_proj|o_proj)\.weight$", name):
                parameter.mul_(VO_SCALE)
    return model


QK_SCALE, VO_SCALE = 1.0, 10.0
MODELS = {arch: context_sensitive(tiny_causal_lm(arch, seed=2, vocab=VOCAB)) for arch in ARCHS}
STATIC = {arch: StaticTarget(MODELS[arch], compile=False) for arch in ARCHS}  # reused: state must not leak


class FuzzDrafter:
    """Drafts every tree with the shape ``parents``, drawing siblings under ``scheme`` from the ``q`` it reports.

    ``q`` after a context is ``(1 - weight) * softmax(table logits) + weight * onehot(guide token)``, where the guide
    token is the next token of ``guide`` when the context is a prefix of it (else the table alone): a guide that is
    the target's own continuation gets drafts accepted, while ``q`` stays exactly what the tokens were drawn from.
    ``lie`` reports a uniform ``q`` instead (a broken drafter)."""

    def __init__(self, parents, scheme, *, seed=0, weight=0.0, guide=(), lie=False):
        self.parents, self.scheme, self.weight, self.guide, self.lie = list(parents), scheme, weight, guide, lie
        self.seed, self.table, self.observed = seed, None, 0

    def q_row(self, context: list[int], vocab: int) -> torch.Tensor:
        if self.table is None:
            self.table = TableDraftModel(vocab, self.seed)
        q = self.table.logits_for(context).softmax(-1)  # (V,)
        if len(context) < len(self.guide) and list(self.guide[: len(context)]) == context:
            q = (1 - self.weight) * q
            q[self.guide[len(context)]] += self.weight
        return q

    def propose(self, request):
        context, vocab = request.input_ids[0].tolist(), request.vocab_size
        num = len(self.parents)
        contexts, tokens = [context] + [None] * num, [0] * num
        q = torch.zeros(1, num + 1, vocab)
        for node, kids in enumerate(children_of(self.parents), start=-1):
            q[0, node + 1] = self.q_row(contexts[node + 1], vocab)
            if kids:
                drawn = draw_siblings(q[:, node + 1], len(kids), sampling=self.scheme, generator=request.generator)
                for kid, token in zip(kids, drawn[0].tolist(), strict=True):
                    tokens[kid], contexts[kid + 1] = token, contexts[node + 1] + [token]
        reported = torch.full_like(q, 1 / vocab) if self.lie else q
        return DraftTree(tokens=torch.tensor([tokens], dtype=torch.long), parents=torch.tensor(self.parents,
                         dtype=torch.long), q=reported, sampling=self.scheme)

    def observe(self, verdict):
        self.observed += 1


# ------------------------------------------------------------------------------------------------ strategies


@st.composite
def drafter_specs(draw, vocab=VOCAB):
    """A row: its prompt and the drafter's tree shape, scheme, table seed and guide weight."""
    return dict(
        prompt=draw(st.lists(st.integers(2, vocab - 1), min_size=1, max_size=6)),
        parents=draw(trees(6)),
        scheme=draw(st.sampled_from(SAMPLING_SCHEMES)),
        seed=draw(st.integers(0, 1000)),
        weight=draw(st.sampled_from([0.0, 0.6, 0.95])),
    )


@st.composite
def greedy_cases(draw):
    verifier = draw(st.sampled_from(["eager", "static", "batched"]))
    budget = draw(st.integers(0, 10))
    return dict(
        verifier=verifier,
        arch=draw(st.sampled_from(ARCHS)),
        rule=draw(st.sampled_from([Greedy(), SpeculativeSampling()])),
        budget=budget,
        eos_at=draw(st.none() | st.integers(0, max(budget - 1, 0))),  # EOS = row 0's greedy token there
        rows=draw(st.lists(drafter_specs(), min_size=2 if verifier == "batched" else 1,
                           max_size=3 if verifier == "batched" else 1)),
        seed=draw(st.integers(0, 2**16)),
    )


# ------------------------------------------------------------------------------------------------ checks


def greedy_continuation(model, prompt: list[int], budget: int) -> list[int]:
    """``model.generate``'s greedy continuation (fp32, no EOS) of ``budget`` tokens."""
    if budget == 0:
        return []
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def cut_at(tokens: list[int], eos: int | None) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos is not None and eos in tokens else tokens


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def check_stats(stats, generated: int, budget: int, stopped: bool) -> None:
    """The per-step record adds up: one entry per step, emitted = accepted + bonus except where the last step was
    cut by EOS or the budget, accepted within the tree's depth, tau the mean accepted length plus one."""
    steps = stats.steps
    assert len(stats.emitted) == len(stats.tree_depth) == len(stats.tree_nodes) == len(stats.tree_parents) == steps
    assert stats.new_tokens == sum(stats.emitted) == generated
    assert generated == budget or stopped
    assert (steps == 0) == (budget == 0)
    for i, (accepted, emitted, depth, nodes, parents) in enumerate(zip(
            stats.accepted, stats.emitted, stats.tree_depth, stats.tree_nodes, stats.tree_parents, strict=True)):
        assert 0 <= accepted <= depth <= nodes == len(parents)
        assert 1 <= emitted <= accepted + 1
        assert emitted == accepted + 1 or i == steps - 1  # only the last step is cut
    if steps:
        assert stats.tau == pytest.approx((sum(stats.accepted) + steps) / steps)
        assert stats.tau >= 1
    rates = stats.acceptance_by_depth
    assert all(0 <= r <= 1 for r in rates if r == r)


def check_greedy(case) -> None:
    """Run ``case`` and assert greedy parity with ``model.generate`` and consistent statistics, row by row."""
    model = MODELS[case["arch"]]
    budget = case["budget"]
    truths = [greedy_continuation(model, row["prompt"], budget) for row in case["rows"]]
    eos = truths[0][case["eos_at"]] if case["eos_at"] is not None and budget else None
    drafters = [FuzzDrafter(row["parents"], row["scheme"], seed=row["seed"], weight=row["weight"],
                            guide=row["prompt"] + truth) for row, truth in zip(case["rows"], truths, strict=True)]
    generator = torch.Generator().manual_seed(case["seed"])
    common = dict(acceptance=case["rule"], max_new_tokens=budget, eos_token_id=eos, generator=generator)
    if case["verifier"] == "batched":
        ids, mask = left_pad([row["prompt"] for row in case["rows"]])
        out = speculative_generate(model, ids, mask, drafter=drafters, **common)
        assert len(out.row_stats) == len(drafters)
        assert out.stats.steps == sum(s.steps for s in out.row_stats) == sum(d.observed for d in drafters)
        assert out.stats.new_tokens == sum(s.new_tokens for s in out.row_stats)
        assert out.forwards == max(s.steps for s in out.row_stats)
        results = [(out.sequences[b][out.attention_mask[b].bool()].tolist(), out.row_stats[b])
                   for b in range(len(drafters))]
    else:
        target = model if case["verifier"] == "eager" else STATIC[case["arch"]]
        out = speculative_generate(target, torch.tensor([case["rows"][0]["prompt"]]), drafter=drafters[0], **common)
        assert out.stats.steps == drafters[0].observed
        results = [(out.sequences[0].tolist(), out.stats)]
    for row, truth, (sequence, stats) in zip(case["rows"], truths, results, strict=True):
        expected = cut_at(truth, eos)
        assert sequence == row["prompt"] + expected, (sequence, row["prompt"] + expected)
        check_stats(stats, len(expected), budget, stopped=eos in expected)


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.fuzz
@FUZZ
@given(greedy_cases())
def test_greedy_output_equals_generate_and_stats_add_up(case):
    check_greedy(case)


def branchy(case):
    """``case`` on the eager verifier with a budget of 10 and a tree of two root children, the second one carrying the
    random sub-tree, drawn without replacement with the guide at weight 0.6: accepted paths often skip node 0."""
    row = case["rows"][0]
    parents = [-1, -1] + [1 if parent == -1 else parent + 2 for parent in row["parents"][:4]]
    return dict(case, verifier="eager", budget=10,
                rows=[dict(row, parents=parents, scheme="without_replacement", weight=0.6)])


def test_a_verifier_that_skips_the_cache_gather_fails_greedy_parity(monkeypatch):
    """The eager verifier, patched to keep the first ``a`` draft nodes' cache entries whatever path was accepted
    (no gather), is caught by the same property on branching trees."""
    commit = HFTarget.commit

    def first_nodes(self, path, num_accepted):
        commit(self, torch.where(path >= 0, torch.arange(path.shape[1]), -1), num_accepted)

    monkeypatch.setattr(HFTarget, "commit", first_nodes)

    @settings(FUZZ, max_examples=40, phases=[Phase.generate], derandomize=True)
    @given(greedy_cases().map(branchy))
    def fuzz_broken(case):
        check_greedy(case)

    with pytest.raises(AssertionError):
        fuzz_broken()


# ------------------------------------------------------------------------------------------------ sampled

SMALL = 5
TRIALS = 300


def peaked(seed: int) -> torch.nn.Module:
    model = tiny_causal_lm("llama", seed=seed, vocab=SMALL)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return model


PEAKED = peaked(0)
PEAKED_STATIC = StaticTarget(PEAKED, compile=False)
SAMPLINGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)]


@st.composite
def sampled_cases(draw):
    return dict(
        verifier=draw(st.sampled_from(["eager", "static", "batched"])),
        sampling=draw(st.sampled_from(SAMPLINGS)),
        row=draw(drafter_specs(vocab=SMALL)),
        seed=draw(st.integers(0, 2**16)),
    )


def two_token_counts(case, lie=False) -> tuple[torch.Tensor, int]:
    """(V, V) counts of the first two generated tokens over ``TRIALS`` rows (the batched verifier: two rows of the
    same prompt per call, each with its own drafter), and the number of rows."""
    row, sampling = case["row"], case["sampling"]
    generator = torch.Generator().manual_seed(case["seed"])
    prompt = torch.tensor([row["prompt"]])
    counts = torch.zeros(SMALL, SMALL)
    kwargs = dict(acceptance=SpeculativeSampling(), max_new_tokens=2, temperature=sampling.temperature,
                  top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=None, generator=generator)

    def drafter():
        return FuzzDrafter(row["parents"], row["scheme"], seed=row["seed"], weight=row["weight"],
                           guide=row.get("guide", ()), lie=lie)

    if case["verifier"] == "batched":
        for _ in range(TRIALS // 2):
            out = speculative_generate(PEAKED, prompt.expand(2, -1), drafter=[drafter(), drafter()], **kwargs)
            for first, second in out.sequences[:, -2:].tolist():
                counts[first, second] += 1
    else:
        target = PEAKED if case["verifier"] == "eager" else PEAKED_STATIC
        for _ in range(TRIALS):
            first, second = speculative_generate(target, prompt, drafter=drafter(), **kwargs).sequences[0, -2:]
            counts[first, second] += 1
    return counts, TRIALS


def comparison(case, lie=False):
    counts, trials = two_token_counts(case, lie)
    expected = exact_two_token_distribution(PEAKED, torch.tensor([case["row"]["prompt"]]), case["sampling"])
    return compare(counts / trials, expected, trials, min_p_value=1e-5)


@pytest.mark.fuzz
@SAMPLED
@given(sampled_cases())
def test_sampled_output_follows_the_target(case):
    result = comparison(case)
    assert result.passed, result


def test_a_drafter_whose_q_lies_fails_the_sampled_check():
    """A drafter that nearly always drafts the target's least likely first token but reports a uniform ``q``."""
    prompt = [1, 2, 3]
    with torch.no_grad():
        unlikely = int(PEAKED(torch.tensor([prompt])).logits[0, -1].argmin())
    case = dict(verifier="eager", sampling=SAMPLINGS[0], seed=0, row=dict(
        prompt=prompt, parents=[-1, 0], scheme="iid", seed=3, weight=0.95, guide=(*prompt, unlikely)))
    result = comparison(case, lie=True)
    assert not result.passed, result
