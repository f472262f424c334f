"""specprim.train._answers: prompts of unequal lengths prefilled alone or in groups of about one length and decoded
together or in length groups give each prompt the tokens of decoding it alone (greedy), finished rows are dropped
without disturbing the others, the length groups are the cheapest split, sampling draws from softmax(logits / T),
and bad prompts and settings are refused."""

import itertools
import random

import pytest
import torch
from _tiny import ARCHITECTURES, tiny_causal_lm
from transformers import DynamicCache

from specprim.hf import cache_kwarg, reserved_cache
from specprim.hf._reserved_cache import ReservedLayer
from specprim.train._answers import _prefill, answer_prompts, decode_groups, pick_tokens, prefill_groups


def _prompts():
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, 97, (n,), generator=generator).tolist() for n in (9, 1, 4, 12, 2, 13, 12)]


def _alone(model, prompt, max_new_tokens, eos):
    """The greedy answer of ``generate`` on the prompt by itself (no padding), up to and including ``eos``."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    answer = out[0, len(prompt):].tolist()
    return answer[:answer.index(eos) + 1] if eos in answer else answer


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "gemma3"])
@pytest.mark.parametrize("step_positions", [None, 2])  # one decoding group; four (lengths 1-2, 4, 9, 12-13)
def test_each_answer_is_the_prompt_decoded_alone(arch, step_positions, monkeypatch):
    model = tiny_causal_lm(arch, seed=2)
    dropped = []
    real = ReservedLayer.batch_select_indices
    monkeypatch.setattr(ReservedLayer, "batch_select_indices", lambda self, rows: dropped.append(len(rows)) or real(
        self, rows))
    prompts = _prompts()
    # an end token that some rows write early: the most frequent first token of the unbounded answers
    free = [_alone(model, p, 10, eos=0) for p in prompts]
    eos = max({a[1] for a in free}, key=[a[1] for a in free].count)
    grouping = {} if step_positions is None else {"step_positions": step_positions}
    assert len(decode_groups(list(map(len, prompts)), **grouping)) == (1 if step_positions is None else 4)
    got = answer_prompts(model, prompts, max_new_tokens=10, temperature=0.0, eos_token_ids={eos}, **grouping)
    want = [_alone(model, p, 10, eos) for p in prompts]
    assert got == want
    assert any(len(a) < 10 for a in want) and any(len(a) == 10 for a in want)
    assert dropped and min(dropped) < len(prompts)  # finished rows left the batch mid-way


def test_prefill_groups_hold_prompts_of_about_one_length():
    assert prefill_groups([8, 0, 3, 11, 1, 12, 11]) == [[4], [2], [0, 3, 6, 5]]  # _prompts(): 6 padded of 48
    assert prefill_groups([100] * 25) == [list(range(10)), list(range(10, 20)), list(range(20, 25))]  # 1,024 each
    assert prefill_groups([600, 600, 10]) == [[2], [0], [1]]  # two of 600 would hold 1,200 positions
    assert prefill_groups([10, 20]) == [[0], [1]]  # half the group would be padding
    assert prefill_groups([]) == []


def _split_cost(lengths, groups, step_positions):
    return sum(step_positions + len(g) * max(lengths[i] for i in g) for g in groups)


def test_decode_groups_are_the_cheapest_split_by_length():
    ours = [9, 1, 4, 12, 2, 13, 12]  # _prompts()
    assert decode_groups(ours, step_positions=2) == [[1, 4], [2], [0], [3, 6, 5]]
    assert decode_groups(ours, step_positions=20) == [[1, 4, 2], [0, 3, 6, 5]]
    assert decode_groups(ours) == [[1, 4, 2, 0, 3, 6, 5]]
    assert decode_groups([500, 100, 100], step_positions=700) == [[1, 2], [0]]  # 700 + 200 + 700 + 500 < 1,500 + 700
    assert decode_groups([500, 100, 100], step_positions=900) == [[1, 2, 0]]
    assert decode_groups([]) == []
    rng = random.Random(0)
    for _ in range(50):  # against every split of the sorted lengths into runs
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 8))]
        step_positions = rng.choice([0, 5, 30, 200])
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        cheapest = min(_split_cost(lengths, [order[a:b] for a, b in itertools.pairwise([0, *cuts, len(order)])],
                                   step_positions)
                       for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
        groups = decode_groups(lengths, step_positions=step_positions)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert _split_cost(lengths, groups, step_positions) == cheapest
    with pytest.raises(ValueError, match="step_positions must be >= 0"):
        decode_groups([3], step_positions=-1)


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "gemma3"])
def test_the_prefilled_cache_holds_each_prompt_as_if_run_alone(arch):
    model = tiny_causal_lm(arch, seed=2)
    prompts = _prompts()
    width = max(len(p) for p in prompts)
    cache = reserved_cache(width + 4)
    with torch.no_grad():
        _prefill(model, prompts, width, cache, torch.device("cpu"))
        for b, prompt in enumerate(prompts):
            n = len(prompt) - 1
            alone = DynamicCache(config=model.config)
            if n:
                model(input_ids=torch.tensor([prompt[:-1]]), use_cache=True, **{cache_kwarg(model): alone})
            for layer, got in enumerate(cache.layers):  # got.keys: (B, H, width - 1, D)
                assert not got.keys[b, :, :width - 1 - n].any() and not got.values[b, :, :width - 1 - n].any()
                if n:
                    torch.testing.assert_close(got.keys[b, :, width - 1 - n:], alone.layers[layer].keys[0])
                    torch.testing.assert_close(got.values[b, :, width - 1 - n:], alone.layers[layer].values[0])


def test_all_rows_ending_at_once_stops_early():
    model = tiny_causal_lm("llama", seed=2)
    prompts = _prompts()
    first = {a[0] for a in answer_prompts(model, prompts, max_new_tokens=1, temperature=0.0, eos_token_ids={0})}
    got = answer_prompts(model, prompts, max_new_tokens=50, temperature=0.0, eos_token_ids=first)
    assert all(len(a) == 1 for a in got)


def test_sampling_draws_from_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(40_000, 4)  # (B, V)
    for temperature in (1.0, 0.5):
        torch.manual_seed(0)
        counts = torch.bincount(pick_tokens(logits, temperature), minlength=4).float()
        want = torch.softmax(logits[0] / temperature, dim=-1) * len(logits)
        chi2 = float(((counts - want) ** 2 / want).sum())
        assert chi2 < 16.3, (temperature, chi2)  # 3 degrees of freedom, p = 0.001
    torch.manual_seed(0)
    untempered = torch.bincount(pick_tokens(logits, 1.0), minlength=4).float()
    want = torch.softmax(logits[0] / 0.5, dim=-1) * len(logits)
    assert float(((untempered - want) ** 2 / want).sum()) > 16.3  # the check tells the temperatures apart
    assert torch.equal(pick_tokens(logits[:2], 0.0), torch.tensor([0, 0]))


def test_bad_prompts_and_settings_are_refused():
    model = tiny_causal_lm("llama")
    for prompts in ([], [[3, 4], []]):
        with pytest.raises(ValueError, match="at least one token"):
            answer_prompts(model, prompts, max_new_tokens=2, temperature=0.0, eos_token_ids={0})
    for steps, temperature in ((0, 0.0), (2, -1.0)):
        with pytest.raises(ValueError, match="max_new_tokens must be >= 1 and temperature >= 0"):
            answer_prompts(model, [[3, 4]], max_new_tokens=steps, temperature=temperature, eos_token_ids={0})
