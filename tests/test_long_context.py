"""Long prompts (2k, 4k and 8k tokens minus the budget and the deepest draft) on a tiny Llama whose context is 8192:
greedy speculative decoding equals ``model.generate`` through the eager verifier and ``StaticTarget(compile=False)``,
with a chain (prompt lookup) and a branching tree (an EAGLE-3 head), and the per-position acceptance record adds up."""

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from test_eagle import hf_greedy, make_head

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.bench._metrics import depth_counts
from specprim.drafters import PromptLookup
from specprim.drafters._eagle_draft import eagle_drafter
from specprim.hf import StaticTarget
from specprim.trees import DynamicTree

CONTEXT = 8192
BUDGET = 32


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", positions=CONTEXT)


@pytest.fixture(scope="module")
def references(target):
    """Per length: the prompt (random tokens with a 64-token passage repeated through it, so that prompt lookup
    finds matches) and ``generate``'s greedy output."""
    out = {}
    generator = torch.Generator().manual_seed(0)
    passage = torch.randint(2, VOCAB, (64,), generator=generator)
    for length in (2048, 4096, CONTEXT):
        # the verifier needs room for the budget and the deepest draft (prompt lookup: 10) past it, within the context
        prompt = torch.randint(2, VOCAB, (length - BUDGET - 16,), generator=generator)
        for start in range(0, prompt.numel() - 64, 512):
            prompt[start:start + 64] = passage
        prompt = prompt[None]
        out[length] = prompt, hf_greedy(target, prompt, BUDGET)
    return out


def _check_record(stats):
    """Every emitted token is counted once; the per-depth counts and the sibling outcomes add up to the accepted
    tokens; depth 1 is reached by every step that drafted."""
    assert sum(stats.emitted) == BUDGET
    assert sum(stats.accepted) + stats.steps >= BUDGET  # the last step may be cut at the budget
    counts = depth_counts(stats)
    assert counts[0][0] == sum(depth >= 1 for depth in stats.tree_depth)  # steps that drafted anything
    assert sum(accepted for _, accepted in counts) == sum(stats.accepted)
    for (_, accepted), (reached_next, _) in zip(counts, counts[1:], strict=False):
        assert reached_next <= accepted
    assert sum(rank >= 0 for _, _, rank in stats.sibling_outcomes) == sum(stats.accepted)
    rates = stats.acceptance_by_depth
    for rate, (reached, accepted) in zip(rates, counts, strict=True):
        assert rate != rate if reached == 0 else rate == pytest.approx(accepted / reached)


@pytest.mark.parametrize("length", [2048, 4096, CONTEXT])
@pytest.mark.parametrize("verifier", ["eager", "static"])
def test_long_prompts_decode_what_generate_decodes(target, references, length, verifier):
    prompt, expected = references[length]
    assert expected.shape[1] == length - 16
    verify = target if verifier == "eager" else StaticTarget(target, compile=False)
    head = make_head(target, 3, 24)
    drafters = {"prompt-lookup": PromptLookup(), "eagle3": eagle_drafter(head, DynamicTree(depth=3, top_k=3, budget=9))}
    for name, drafter in drafters.items():
        out = speculative_generate(verify, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=BUDGET,
                                   eos_token_id=None)
        assert torch.equal(out.sequences, expected), (name, verifier, length)
        _check_record(out.stats)
        assert sum(out.stats.tree_nodes) > 0  # drafts were verified at this length
