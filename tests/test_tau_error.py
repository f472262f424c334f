"""The standard error of tau over prompts, and the paired error of two drafters' difference: checked against the
spread of tau over many simulated prompt sets, where a prompt's difficulty is shared by both drafters."""

import math

import pytest
import torch

from specprim._tau_error import PromptCounts, tau_difference, tau_estimate


def _prompt_sets(sets: int, prompts: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sets`` x ``prompts`` simulated runs of two drafters: per prompt a difficulty p ~ U(0.2, 0.7) of accepting
    each next draft token (the second drafter: p + 0.05), steps ~ 5..60; accepted tokens per step geometric in p,
    at most 4. Returns (steps, accepted of the first per step, the same of the second), each step's count 0 past
    its prompt's steps: (sets, prompts) and twice (sets, prompts, 60)."""
    generator = torch.Generator().manual_seed(seed)
    difficulty = 0.2 + 0.5 * torch.rand(sets, prompts, generator=generator)
    steps = torch.randint(5, 61, (sets, prompts), generator=generator)

    def accepted(p: torch.Tensor) -> torch.Tensor:
        per_step = torch.rand(sets, prompts, 60, 4, generator=generator) < p[..., None, None]
        run = per_step.int().cumprod(-1).sum(-1)  # (sets, prompts, 60): tokens accepted in a row, each step
        used = torch.arange(60) < steps[..., None]
        return run * used

    return steps, accepted(difficulty), accepted(difficulty + 0.05)


def _counts(accepted: torch.Tensor, steps: torch.Tensor) -> PromptCounts:
    return PromptCounts(accepted.tolist(), steps.tolist())


def test_the_stderr_matches_the_spread_of_tau_over_prompt_sets():
    steps, first, _ = _prompt_sets(sets=400, prompts=30)
    first = first.sum(-1)
    estimates = [tau_estimate(_counts(a, s)) for a, s in zip(first, steps, strict=True)]
    spread = torch.tensor([e.tau for e in estimates]).std().item()
    typical = sum(e.stderr for e in estimates) / len(estimates)
    assert typical == pytest.approx(spread, rel=0.15)
    tau = (first.sum(1) + steps.sum(1)) / steps.sum(1)
    assert [e.tau for e in estimates] == pytest.approx(tau.tolist())


def test_the_paired_difference_error_matches_its_spread_and_is_below_the_unpaired_one():
    steps, first, second = _prompt_sets(sets=400, prompts=30, seed=1)
    first, second = first.sum(-1), second.sum(-1)
    paired = [tau_difference(_counts(a, s), _counts(b, s)) for a, b, s in zip(first, second, steps, strict=True)]
    spread = torch.tensor([d.tau for d in paired]).std().item()
    typical = sum(d.stderr for d in paired) / len(paired)
    assert typical == pytest.approx(spread, rel=0.15)
    unpaired = [math.hypot(tau_estimate(_counts(a, s)).stderr, tau_estimate(_counts(b, s)).stderr)
                for a, b, s in zip(first, second, steps, strict=True)]
    assert typical < 0.8 * sum(unpaired) / len(unpaired)
    mean = sum(d.tau for d in paired) / len(paired)
    assert mean > 3 * spread / math.sqrt(len(paired))  # the second drafter is better, and it shows


def test_an_error_over_target_forwards_fails_the_spread_check():
    """The check above rejects a wrong formula: the error that takes every target forward as an independent sample
    (the spread of accepted tokens per step over the square root of all steps) ignores that a prompt's steps share
    its difficulty, and falls well short of the spread."""
    steps, first, _ = _prompt_sets(sets=400, prompts=30)
    used = torch.arange(60) < steps[..., None]
    wrong = torch.stack([first[i][used[i]].float().std() / math.sqrt(used[i].sum()) for i in range(400)]).mean()
    spread = ((first.sum((1, 2)) + steps.sum(1)) / steps.sum(1)).float().std().item()
    assert wrong.item() < 0.8 * spread


def test_exact_cases_and_bad_input():
    same_rate = tau_estimate(PromptCounts([2, 4], [2, 4]))  # the same rate on every prompt
    assert (same_rate.tau, same_rate.stderr) == pytest.approx((2.0, 0.0))
    assert tau_estimate(PromptCounts([3], [2])).stderr == 0.0
    same = PromptCounts([1, 5, 2], [3, 4, 4])
    assert tau_difference(same, same).tau == 0.0 and tau_difference(same, same).stderr == 0.0
    with pytest.raises(ValueError, match="one count per prompt"):
        PromptCounts([1, 2], [3])
    with pytest.raises(ValueError, match="at least one target forward"):
        PromptCounts([], [])
    with pytest.raises(ValueError, match="counts"):
        PromptCounts([-1, 2], [3, 3])
    with pytest.raises(ValueError, match="the same prompts"):
        tau_difference(same, PromptCounts([1], [3]))
