"""``StaticEagleDraftModel``: an EAGLE head drafting through a static KV cache with padded node batches. Eager, every
``begin`` / ``extend`` returns :class:`EagleDraftModel`'s logits (fp32, 1e-5) through whole generations with a
branching tree, a one-token prompt and a cache that grows; compiled, greedy decoding still equals ``generate``; a
variant that writes padding over real cache entries is caught; bad inputs raise."""

import pytest
import torch
from _tiny import tiny_causal_lm
from test_eagle import PROMPT, features_of, hf_greedy, make_head, request, trained_eagle3

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import PromptLookup, StaticEagleDraftModel, TreeDrafter, UnionDrafter, static_drafting
from specprim.drafters._eagle_draft import EagleDraftModel, eagle_drafter
from specprim.hf import StaticTarget, _static_target
from specprim.trees import Chain, DynamicTree

BRANCHING = DynamicTree(depth=3, top_k=3, budget=9)
SHORT = PROMPT[:, :4]


@pytest.fixture(scope="module")
def trained():
    """test_eagle's tiny Llama with an EAGLE-3 head trained to get drafts accepted."""
    return trained_eagle3.__wrapped__()


class Recorder:
    """A `TreeDraftModel` that runs a reference and a candidate model side by side, hands the tree builder the
    reference's logits and keeps both outputs of every call."""

    def __init__(self, reference, candidate):
        self.reference, self.candidate = reference, candidate
        self.feature_layers = reference.feature_layers
        self.pairs = []

    def begin(self, request):
        return self._both("begin", request)

    def extend(self, parents, tokens):
        return self._both("extend", parents, tokens)

    def _both(self, name, *args):
        expected = getattr(self.reference, name)(*args)
        self.pairs.append((expected, getattr(self.candidate, name)(*args)))
        return expected


def _record(target, head, prompt, max_new_tokens, tree=BRANCHING, **static):
    recorder = Recorder(EagleDraftModel(head), StaticEagleDraftModel(head, compile=False, **static))
    out = speculative_generate(target, prompt, drafter=TreeDrafter(recorder, tree), acceptance=Greedy(),
                               max_new_tokens=max_new_tokens)
    return out, recorder


def _assert_same_logits(recorder):
    assert len(recorder.pairs) > 10
    for expected, got in recorder.pairs:
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(got))
        torch.testing.assert_close(got[finite], expected[finite], atol=1e-5, rtol=0)


@pytest.mark.parametrize("tree", [BRANCHING, Chain(3)], ids=["dynamic", "chain"])
def test_eager_static_drafting_returns_the_dynamic_cache_logits(trained, tree):
    target, head = trained
    out, recorder = _record(target, head, SHORT, 40, tree)
    assert out.stats.tau > 1.3  # several pairs committed per step: padded begin() batches of 2..4 rows
    _assert_same_logits(recorder)
    for prompt in (PROMPT[:, :1], PROMPT):  # the zero-feature pair of a one-token prompt; a longer prompt
        _assert_same_logits(_record(target, head, prompt, 16, tree)[1])


def test_eager_static_drafting_untrained_heads_on_qwen2():
    target = tiny_causal_lm("qwen2")
    for version, vocab in ((3, 24), (1, None)):
        _assert_same_logits(_record(target, make_head(target, version, vocab), PROMPT, 24)[1])


def test_the_draft_cache_grows_mid_generation(monkeypatch, trained):
    monkeypatch.setattr(_static_target, "CACHE_ROUNDING", 8)
    target, head = trained
    recorder = _record(target, head, SHORT, 40)[1]
    _assert_same_logits(recorder)
    assert recorder.candidate.cache.layers[0].max_cache_len % 8 == 0


def test_a_variant_that_pads_over_the_context_is_caught(trained):
    class PadsOverContext(StaticEagleDraftModel):
        def _run(self, tokens, hidden, positions, allowed, write_at, eager):
            return super()._run(tokens, hidden, positions, allowed, max(write_at - 1, 0), eager)

    target, head = trained
    recorder = Recorder(EagleDraftModel(head), PadsOverContext(head, compile=False))
    speculative_generate(target, SHORT, drafter=TreeDrafter(recorder, BRANCHING), acceptance=Greedy(),
                         max_new_tokens=24)
    with pytest.raises(AssertionError):
        _assert_same_logits(recorder)


def test_compiled_static_drafting_and_verification_equal_generate(trained):
    target, head = trained
    drafter = TreeDrafter(StaticEagleDraftModel(head), BRANCHING)
    verifier = StaticTarget(target)
    for prompt in (SHORT, PROMPT):
        out = speculative_generate(verifier, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=32)
        assert torch.equal(out.sequences, hf_greedy(target, prompt, 32))
        assert out.stats.tau > 1.2


def test_compile_sizes_runs_the_step_on_features_of_the_head_s_dtype():
    """The dummy forwards compile the graphs generation runs: their features have the head's dtype (bf16 here), as a
    generation's do, so a timed generation does not recompile for another input dtype."""
    head = make_head(tiny_causal_lm("llama"), 3, 24).to(torch.bfloat16)
    model = StaticEagleDraftModel(head, compile=False, min_cache_length=32)
    dtypes = []
    step = model._step
    model._step = lambda ids, hidden, positions, mask: dtypes.append(hidden.dtype) or step(ids, hidden, positions, mask)
    model.compile_sizes((2, 4))
    assert dtypes == [torch.bfloat16, torch.bfloat16]


def test_batches_raise(trained):
    target, head = trained
    ids = SHORT.repeat(2, 1)
    with pytest.raises(ValueError, match="one sequence"):
        StaticEagleDraftModel(head, compile=False).begin(request(ids, features_of(target, head, ids), 0, 0))


def test_static_drafting_swaps_every_eagle_part_and_keeps_the_rest(trained):
    target, head = trained
    union = UnionDrafter(eagle_drafter(head, BRANCHING), PromptLookup(), max_nodes=5)
    swapped = static_drafting(union, compile=False, min_cache_length=64)
    assert isinstance(swapped, UnionDrafter) and swapped.max_nodes == 5
    eagle_part, lookup = swapped.drafters
    assert type(eagle_part.model) is StaticEagleDraftModel and eagle_part.model.head is head
    assert eagle_part.tree is BRANCHING and lookup is union.drafters[1]
    plain = PromptLookup()
    assert static_drafting(plain) is plain
    out = speculative_generate(target, SHORT, drafter=swapped, acceptance=Greedy(), max_new_tokens=32)
    assert torch.equal(out.sequences, hf_greedy(target, SHORT, 32))


def test_compile_sizes_leaves_a_model_that_only_starts_a_new_generation(trained):
    target, head = trained
    model = StaticEagleDraftModel(head, compile=False, min_cache_length=64)
    model.compile_sizes((2, 4))
    assert model.cache.layers[0].max_cache_len >= 64
    features = features_of(target, head, SHORT)
    with pytest.raises(ValueError, match="starts at position"):
        model.begin(request(SHORT, features, 1, 1))  # a mid-generation request after compile_sizes
    reference = EagleDraftModel(head).begin(request(SHORT, features, 0, 0))
    torch.testing.assert_close(model.begin(request(SHORT, features, 0, 0)), reference, atol=1e-5, rtol=0)
