"""specprim.train._answers: prompts of unequal lengths prefilled alone and decoded together give each prompt the
tokens of decoding it alone (greedy), finished rows are dropped without disturbing the others, sampling draws from
softmax(logits / T), and bad prompts are refused."""

import pytest
import torch
from _tiny import ARCHITECTURES, tiny_causal_lm

from specprim.hf._reserved_cache import ReservedLayer
from specprim.train._answers import answer_prompts, pick_tokens


def _prompts():
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, 97, (n,), generator=generator).tolist() for n in (9, 1, 4, 12, 2)]


def _alone(model, prompt, max_new_tokens, eos):
    """The greedy answer of ``generate`` on the prompt by itself (no padding), up to and including ``eos``."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    answer = out[0, len(prompt):].tolist()
    return answer[:answer.index(eos) + 1] if eos in answer else answer


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "gemma3"])
def test_each_answer_is_the_prompt_decoded_alone(arch, monkeypatch):
    model = tiny_causal_lm(arch, seed=2)
    dropped = []
    real = ReservedLayer.batch_select_indices
    monkeypatch.setattr(ReservedLayer, "batch_select_indices", lambda self, rows: dropped.append(len(rows)) or real(
        self, rows))
    prompts = _prompts()
    # an end token that some rows write early: the most frequent first token of the unbounded answers
    free = [_alone(model, p, 10, eos=0) for p in prompts]
    eos = max({a[1] for a in free}, key=[a[1] for a in free].count)
    got = answer_prompts(model, prompts, max_new_tokens=10, temperature=0.0, eos_token_ids={eos})
    want = [_alone(model, p, 10, eos) for p in prompts]
    assert got == want
    assert any(len(a) < 10 for a in want) and any(len(a) == 10 for a in want)
    assert dropped and min(dropped) < len(prompts)  # finished rows left the batch mid-way


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


def test_bad_prompts_are_refused():
    model = tiny_causal_lm("llama")
    for prompts in ([], [[3, 4], []]):
        with pytest.raises(ValueError, match="at least one token"):
            answer_prompts(model, prompts, max_new_tokens=2, temperature=0.0, eos_token_ids={0})
