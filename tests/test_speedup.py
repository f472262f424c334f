"""The speedup model: sibling outcomes recorded by the loop, positional acceptance rates, expected tau checked by
simulation, measured costs, and the hardware-aware choice of tree."""

import itertools
import random

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import ModelDrafter, PromptLookup
from specprim.presets import Method, prompt_lookup, with_tree
from specprim.speedup import (
    CostModel,
    RankAcceptance,
    best_tree,
    expected_tau,
    measure_costs,
    predict,
    sibling_outcomes,
    sibling_ranks,
)
from specprim.trees import Chain, DynamicTree, StaticTree, parse_tree


def test_sibling_outcomes_and_ranks():
    parents = [-1, -1, 0, 0, 1, 3]  # root -> {0, 1}; 0 -> {2, 3}; 1 -> {4}; 3 -> {5}
    assert sibling_ranks(parents) == [0, 1, 0, 1, 0, 0]
    assert sibling_outcomes(parents, [0, 3, 5]) == [(1, 2, 0), (2, 2, 1), (3, 1, 0)]
    assert sibling_outcomes(parents, [1]) == [(1, 2, 1), (2, 1, -1)]
    assert sibling_outcomes(parents, []) == [(1, 2, -1)]
    assert sibling_outcomes([], []) == []


def test_rank_acceptance_counts_trials_and_falls_back_to_pooled_rates():
    outcomes = [(1, 3, 0)] * 30 + [(1, 3, 2)] * 10 + [(1, 3, -1)] * 10 + [(2, 2, 1)] * 2
    acc = RankAcceptance.from_outcomes(outcomes)
    assert acc.trials[0] == (50, 20, 20) and acc.accepted[0] == (30, 0, 10)
    assert acc.rate(1, 0) == pytest.approx(0.6) and acc.rate(1, 2) == pytest.approx(0.5)
    # depth 2 has 2 trials (< min_trials): rank 0 falls back to the pooled rate (30 of 52)
    assert acc.rate(2, 0) == pytest.approx(30 / 52)
    assert acc.rate(1, 7) == 0.0
    assert acc.child_probability(1, 2) == pytest.approx(0.5 * (1 - 0.6) * (1 - 0.0))
    with pytest.raises(ValueError, match="invalid sibling outcome"):
        RankAcceptance.from_outcomes([(1, 2, 2)])


def _simulated_tau(parents, rates, trials=40_000, seed=0):
    """Walk the tree under the positional model: at each accepted node try its children in rank order, each
    accepted with ``rates[(depth, rank)]``; count accepted nodes + the bonus token."""
    rng = random.Random(seed)
    children = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    total = 0
    for _ in range(trials):
        node, depth, accepted = -1, 1, 0
        while True:
            nxt = None
            for rank, child in enumerate(children.get(node, [])):
                if rng.random() < rates.get((depth, rank), 0.0):
                    nxt = child
                    break
            if nxt is None:
                break
            node, depth, accepted = nxt, depth + 1, accepted + 1
        total += accepted + 1
    return total / trials


def _acceptance_with(rates):
    """A RankAcceptance whose estimated rates are exactly ``rates`` (1000 trials each)."""
    depth_max = max(d for d, _ in rates)
    width = 1 + max(k for _, k in rates)
    trials = tuple(tuple(1000 for _ in range(width)) for _ in range(depth_max))
    accepted = tuple(tuple(round(1000 * rates.get((d, k), 0.0)) for k in range(width)) for d in range(1, depth_max + 1))
    return RankAcceptance(trials, accepted)


RATES = {(1, 0): 0.7, (1, 1): 0.4, (1, 2): 0.2, (2, 0): 0.6, (2, 1): 0.3, (3, 0): 0.5, (3, 1): 0.2}


@pytest.mark.parametrize("parents", [[-1, 0, 1], [-1, -1, -1, 0, 0, 1, 3, 3], [-1, -1, 1, 2, 0]])
def test_expected_tau_matches_a_simulation_of_the_positional_model(parents):
    acc = _acceptance_with(RATES)
    simulated = _simulated_tau(parents, RATES)
    assert expected_tau(parents, acc) == pytest.approx(simulated, abs=0.02)


def test_the_simulation_check_rejects_a_formula_without_sibling_exclusion():
    """A broken tau that adds each sibling's rate independently (ignoring that an earlier sibling's acceptance
    excludes the later ones) must disagree with the simulation."""
    parents = [-1, -1, -1, 0, 0, 1]
    acc = _acceptance_with(RATES)
    depths = [1, 1, 1, 2, 2, 2]
    reach = []
    for node, parent in enumerate(parents):
        reach.append((1.0 if parent == -1 else reach[parent]) * acc.rate(depths[node], sibling_ranks(parents)[node]))
    broken = 1 + sum(reach)
    assert abs(broken - _simulated_tau(parents, RATES)) > 0.1


def test_chain_prediction_reproduces_the_measured_tau_exactly():
    """For full-depth chains, rates estimated from a run telescope to that run's own tau."""
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=0)
    with torch.no_grad():  # a draft that agrees with the target often, not always
        for weight in draft.parameters():
            weight.add_(0.6 * weight.std() * torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)))
    prompt = torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    out = speculative_generate(target, prompt, drafter=ModelDrafter(draft, Chain(3)), acceptance=Greedy(),
                               max_new_tokens=60)
    stats = out.stats
    assert len(stats.sibling_outcomes) >= stats.steps - 1  # the last step may have no budget left to draft
    assert 0 < sum(stats.accepted) < 3 * stats.steps
    full = [i for i, d in enumerate(stats.tree_depth) if d == 3]
    outcomes, steps = [], 0
    for i in full:  # rebuild the outcomes of the full-depth steps only
        accepted = stats.accepted[i]
        outcomes += [(d, 1, 0) for d in range(1, accepted + 1)] + ([(accepted + 1, 1, -1)] if accepted < 3 else [])
        steps += 1
    acc = RankAcceptance.from_outcomes(outcomes, min_trials=1)
    achieved = 1 + sum(stats.accepted[i] for i in full) / steps
    assert expected_tau([-1, 0, 1], acc) == pytest.approx(achieved)
    # and the loop's own record has exactly these outcomes for full-depth steps
    assert set(stats.sibling_outcomes) <= {(d, 1, r) for d in (1, 2, 3) for r in (0, -1)}


def test_cost_model_interpolates_and_validates():
    costs = CostModel((0, 4, 16), (0.05, 0.06, 0.10), draft_s=(0.01, 0.015), other_s=0.002)
    assert costs.step_s == 0.05
    assert costs.verify(2) == pytest.approx(0.055)
    assert costs.verify(32) == pytest.approx(0.10 + 16 * (0.04 / 12))
    assert costs.draft(0) == 0.0 and costs.draft(1) == 0.01 and costs.draft(3) == pytest.approx(0.02)
    assert costs.step(4, 2) == pytest.approx(0.015 + 0.06 + 0.002)
    with pytest.raises(ValueError, match="start at 0"):
        CostModel((1, 2), (0.1, 0.2))
    with pytest.raises(ValueError, match="positive"):
        CostModel((0, 1), (0.1, -0.2))
    with pytest.raises(ValueError, match="no drafting costs"):
        CostModel((0,), (0.1,)).draft(2)


def test_padded_cost_model_prices_a_tree_by_its_padded_size():
    from specprim.speedup import padded_sizes

    assert padded_sizes(32) == (0, 1, 3, 7, 15, 31, 63) and padded_sizes(3) == (0, 1, 3)
    costs = CostModel((0, 1, 3, 7, 15), (0.05, 0.05, 0.052, 0.06, 0.08), padded=True)
    assert [costs.verify(n) for n in (0, 1, 2, 3, 4, 7, 8, 15)] == [0.05, 0.05, 0.052, 0.052, 0.06, 0.06, 0.08, 0.08]
    unpadded = CostModel(costs.verify_sizes, costs.verify_s)
    assert unpadded.verify(4) == pytest.approx(0.054)  # interpolated: a padded verifier really pays 0.06


def test_tune_through_a_static_target_uses_padded_costs():
    from specprim.hf import StaticTarget
    from specprim.speedup import tune

    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompts = [torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))]
    method = Method(ModelDrafter(draft, Chain(4)), Greedy())
    result = tune(StaticTarget(target, compile=False), method, prompts, max_new_tokens=8,
                  probe_tree=DynamicTree(depth=2, top_k=2, budget=4), max_nodes=4, repeats=1)
    assert result.costs.padded and result.costs.verify_sizes == (0, 1, 3, 7)
    assert result.choice.nodes <= 4


def _all_trees(max_nodes, max_depth, max_width):
    """Every set of rank paths closed under parents and earlier siblings, up to ``max_nodes`` nodes."""
    universe = [p for d in range(1, max_depth + 1) for p in itertools.product(range(max_width), repeat=d)]
    for size in range(1, max_nodes + 1):
        for subset in itertools.combinations(universe, size):
            chosen = set(subset)
            if all((p[:-1] in chosen or len(p) == 1) and (p[-1] == 0 or (*p[:-1], p[-1] - 1) in chosen)
                   for p in chosen):
                yield sorted(chosen, key=lambda p: (len(p), p))


def test_best_tree_of_every_size_is_optimal_by_brute_force():
    rates = {(1, 0): 0.7, (1, 1): 0.5, (2, 0): 0.6, (2, 1): 0.4, (3, 0): 0.5, (3, 1): 0.3}
    acc = _acceptance_with(rates)
    costs = CostModel((0, 64), (0.05, 0.05), draft_s=(1e-3, 2e-3, 3e-3))  # flat verification
    choice = best_tree(acc, costs, max_nodes=5, max_depth=3, max_width=2)
    best_by_size = {}
    for paths in _all_trees(5, 3, 2):
        tau = expected_tau(StaticTree(paths=tuple(paths)).parent_list, acc)
        best_by_size[len(paths)] = max(best_by_size.get(len(paths), 0.0), tau)
    for nodes, tau, _, _ in choice.curve[1:]:
        assert tau == pytest.approx(best_by_size[nodes])


def test_best_tree_follows_the_hardware():
    acc = _acceptance_with(RATES)
    flat = CostModel((0, 64), (0.05, 0.0501), draft_s=(1e-4,) * 8)
    steep = CostModel((0, 1, 64), (0.05, 0.2, 5.0), draft_s=(0.01,) * 8)
    wide = best_tree(acc, flat, max_nodes=32)
    assert wide.nodes == 32 and wide.prediction.speedup > 1.5
    assert best_tree(acc, steep).nodes == 0  # speculation never pays: plain decoding
    assert wide.dynamic_tree() == DynamicTree(depth=wide.depth, top_k=wide.top_k, budget=32)
    assert wide.static_tree().parent_list and wide.spec().startswith("dynamic:")
    pred = predict(wide.static_tree().parent_list, acc, flat)
    assert pred.tau == pytest.approx(wide.prediction.tau) and pred.speedup == pytest.approx(wide.prediction.speedup)
    with pytest.raises(ValueError, match="plain decoding"):
        best_tree(acc, steep).dynamic_tree()
    with pytest.raises(ValueError, match="max_nodes"):
        best_tree(acc, flat, max_nodes=0)


def test_measure_costs_on_a_tiny_model():
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompt = torch.randint(2, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0))
    costs = measure_costs(target, prompt, drafter_for_depth=lambda d: ModelDrafter(draft, Chain(d)),
                          depths=(1, 2), sizes=(0, 4), repeats=2, tokens_per_depth=6)
    assert costs.verify_sizes == (0, 4) and len(costs.draft_s) == 2
    assert costs.other_s > 0 or costs.other_per_node_s > 0  # acceptance and the cache commit take time each step
    assert all(t > 0 for t in (*costs.verify_s, *costs.draft_s))
    with pytest.raises(ValueError, match="depths must be"):
        measure_costs(target, prompt, drafter_for_depth=lambda d: ModelDrafter(draft, Chain(d)), depths=(2,))


def test_parse_tree_and_with_tree():
    assert parse_tree("chain:4") == Chain(4) and parse_tree("chain:k=2") == Chain(2)
    assert parse_tree("dynamic:depth=3,top_k=4,budget=10") == DynamicTree(depth=3, top_k=4, budget=10)
    assert parse_tree("static:2,1") == StaticTree.from_branching((2, 1))
    sampled = parse_tree("sampled:3,1")
    assert sampled.paths == StaticTree.from_branching((3, 1)).paths and sampled.sample_without_replacement
    assert not parse_tree("static:3,1").sample_without_replacement
    for bad in ("chain:x", "dynamic:depth=3", "pyramid:3", "chain:0", "sampled:", "sampled:0", "static:2,x"):
        with pytest.raises(ValueError):
            parse_tree(bad)
    draft = tiny_causal_lm("llama", seed=1)
    method = Method(ModelDrafter(draft, Chain(4)), Greedy())
    swapped = with_tree(method, Chain(2))
    assert swapped.drafter.tree == Chain(2) and method.drafter.tree == Chain(4)
    assert swapped.drafter.model is method.drafter.model
    with pytest.raises(ValueError, match="takes no tree"):
        with_tree(prompt_lookup(), Chain(2))
    assert isinstance(prompt_lookup().drafter, PromptLookup)


def test_tune_measures_acceptance_and_costs_and_reports_a_choice():
    from specprim._tune_cli import report
    from specprim.acceptance import SpeculativeSampling
    from specprim.speedup import tune

    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompts = [torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    method = Method(ModelDrafter(draft, Chain(4)), SpeculativeSampling())
    result = tune(target, method, prompts, max_new_tokens=8, probe_tree=DynamicTree(depth=2, top_k=2, budget=4),
                  max_nodes=4, repeats=1)
    assert result.acceptance.max_depth >= 1 and result.probe_tau >= 1.0
    assert len(result.costs.draft_s) == 2 and result.costs.verify_sizes[-1] == 4
    assert result.choice.nodes <= 4 and result.choice.depth <= 2 and result.choice.top_k <= 2
    assert result.to_json()["choice"]["spec"] == result.choice.spec()
    text = report(result, "tiny")
    assert "best tree: --tree" in text and "| nodes |" in text
    with pytest.raises(ValueError, match="takes no tree"):
        tune(target, prompt_lookup(), prompts)
    with pytest.raises(ValueError, match="at least one prompt"):
        tune(target, method, [])


def _repetitive_prompts():
    # repeated n-grams give prompt lookup something to find
    return [torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]), torch.tensor([[9, 3, 4, 9, 3, 4, 9, 3]])]


def test_tune_lookup_replays_every_length_exactly_as_live_greedy_runs():
    from specprim.drafters import UnionDrafter
    from specprim.speedup import CostModel, tune_lookup

    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    method = Method(ModelDrafter(draft, DynamicTree(depth=2, top_k=2, budget=3)), Greedy())
    costs = CostModel(verify_sizes=(0, 4, 16), verify_s=(1.0, 1.5, 3.0), other_s=0.1)
    prompts = _repetitive_prompts()
    choice = tune_lookup(target, method, prompts, costs, lengths=(0, 2, 4), max_new_tokens=12)
    assert [row.num_tokens for row in choice.rows] == [0, 2, 4]
    for row in choice.rows:
        live = method if row.num_tokens == 0 else Method(
            UnionDrafter(method.drafter, prompt_lookup(num_tokens=row.num_tokens, max_matches=1).drafter), Greedy())
        runs = [live.generate(target, ids, max_new_tokens=12).stats for ids in prompts]
        steps = sum(s.steps for s in runs)
        assert row.tau == pytest.approx(sum(sum(s.accepted) + s.steps for s in runs) / steps)
        assert row.nodes == pytest.approx(sum(sum(s.tree_nodes) for s in runs) / steps)
        # seconds per step from the cost model, and speedup = tokens * plain step / predicted seconds
        verify = sum(costs.verify(n) + 0.1 for s in runs for n in s.tree_nodes) / steps
        assert row.step_s == pytest.approx(row.draft_s + verify)
        assert row.speedup == pytest.approx(24 * 1.0 / (row.step_s * steps))
    assert choice.best is max(choice.rows, key=lambda r: r.speedup)
    with pytest.raises(ValueError, match="non-negative"):
        tune_lookup(target, method, prompts, costs, lengths=(-1,))
    with pytest.raises(ValueError, match="at least one prompt"):
        tune_lookup(target, method, [], costs)


def test_tune_lookup_follows_the_verification_cost():
    from specprim.speedup import CostModel, tune_lookup

    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    method = Method(ModelDrafter(draft, Chain(1)), Greedy())
    prompts = _repetitive_prompts()
    # seconds-scale costs make the measured drafting time negligible
    flat = CostModel(verify_sizes=(0, 64), verify_s=(100.0, 100.0))
    steep = CostModel(verify_sizes=(0, 1), verify_s=(100.0, 10_000.0))
    flat_choice = tune_lookup(target, method, prompts, flat, lengths=(0, 4), max_new_tokens=12)
    assert flat_choice.best is max(flat_choice.rows, key=lambda r: r.tau)
    assert flat_choice.rows[1].tau > flat_choice.rows[0].tau  # lookup finds the repeats
    assert tune_lookup(target, method, prompts, steep, lengths=(0, 4), max_new_tokens=12).best.num_tokens == 0


def test_tune_cli_accepts_one_tree_method_optionally_with_prompt_lookup():
    import argparse

    from specprim._tune_cli import _lengths, _tunable_method, lookup_report
    from specprim.speedup._union import LookupChoice, LookupRow

    assert _tunable_method("eagle3+prompt-lookup") == "eagle3+prompt-lookup"
    assert _tunable_method("prompt-lookup+medusa") == "prompt-lookup+medusa"
    for bad in ("prompt-lookup", "eagle3+medusa", "eagle3+eagle3", "nope"):
        with pytest.raises(argparse.ArgumentTypeError):
            _tunable_method(bad)
    assert _lengths("0,2,6") == (0, 2, 6)
    for bad in ("", "2,-1", "a"):
        with pytest.raises(argparse.ArgumentTypeError):
            _lengths(bad)
    rows = (LookupRow(0, 1.5, 3.0, 0.01, 0.05, 1.2), LookupRow(6, 1.7, 8.0, 0.01, 0.055, 1.3))
    text = lookup_report(LookupChoice(rows), "eagle3", "dynamic:depth=1,top_k=3,budget=3")
    assert "| 6 (best) |" in text
    assert "best: --method eagle3+prompt-lookup --num-draft 6 --tree dynamic:depth=1,top_k=3,budget=3" in text


def test_tune_reads_a_recipe_and_measures_its_tree_part():
    import argparse

    from specprim._tune_cli import _recipes, add_tune_parser
    from specprim.recipes import load_recipe

    parser = argparse.ArgumentParser()
    add_tune_parser(parser.add_subparsers())

    def args(*argv):
        return parser.parse_args(["tune", *argv])

    shipped = load_recipe("smollm2-135m-instruct-eagle3:greedy")
    namespace = args("--recipe", "smollm2-135m-instruct-eagle3:greedy")
    tuned, measured = _recipes(namespace)
    assert tuned == shipped and namespace.method == "eagle3+prompt-lookup"
    assert (measured.method, measured.tree, measured.datastores, measured.max_nodes) == ("eagle3", None, (), None)
    assert (measured.dtype, measured.pack, measured.verifier) == ("bfloat16", True, "compiled")
    tuned, measured = _recipes(args("--method", "early-exit", "--exit-layer", "1", "--static-verify"))
    assert (measured.method, measured.exit_layer, measured.verifier) == ("early-exit", 1, "compiled")
    with pytest.raises(ValueError, match="pass --method"):
        _recipes(args())
    assert _recipes(args("--method", "eagle3", "--quantize", "int8"))[1].quantize == "int8"  # the shared options
    with pytest.raises(SystemExit):
        args("--method", "eagle3", "--tree", "chain:3")  # tune chooses the tree itself
