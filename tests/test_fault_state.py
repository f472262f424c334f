"""A drafter or target that raises mid-generation leaves no state behind: the next call on the same objects gives
what a fresh run gives (greedy, fp32, tiny models), for an error and for ``KeyboardInterrupt``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from _tiny import tiny_causal_lm, tiny_tokenizer
from test_eagle import trained_eagle3

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import (
    MedusaDraftModel,
    MedusaHeads,
    ModelDrafter,
    MTPDraftModel,
    MTPHead,
    PromptLookup,
    TreeDrafter,
    UnionDrafter,
    eagle_drafter,
    static_drafting,
)
from specprim.hf import StaticTarget
from specprim.recipes import Recipe
from specprim.trees import Chain, DynamicTree

PROMPT = torch.tensor([[3, 9, 4, 9, 4, 17, 3, 9, 4, 22, 8]])
NEW_TOKENS = 24


class Fault(RuntimeError):
    """The error a broken component raises."""


def _fail_on_call(module: torch.nn.Module, call: int, error: BaseException) -> Callable[[], None]:
    """Make ``module`` raise ``error`` on its ``call``-th forward (1-based); returns the function that undoes it."""
    count = 0

    def hook(*_):
        nonlocal count
        count += 1
        if count == call:
            raise error

    return module.register_forward_pre_hook(hook).remove


@pytest.fixture(scope="module")
def trained():
    """The tiny Llama target with an EAGLE-3 head trained to get drafts accepted (test_eagle's)."""
    return trained_eagle3.__wrapped__()


@pytest.fixture(scope="module")
def target(trained):
    return trained[0]


@pytest.fixture(scope="module")
def draft():
    """The target's weights, its last layer perturbed: a draft whose tokens are accepted often, not always."""
    model = tiny_causal_lm("llama", seed=0)
    with torch.no_grad():
        for parameter in model.model.layers[1].parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(5)) * 0.05)
    return model


# name -> (make drafter for target and draft; the module inside the drafter to break)
def _draft_lm(target, draft, head=None):
    return ModelDrafter(draft, tree=DynamicTree(depth=3, top_k=2, budget=5)), draft.model.layers[1]


def _static_draft_lm(target, draft, head=None):
    drafter = static_drafting(ModelDrafter(draft, tree=Chain(3)), compile=False, min_cache_length=96)
    return drafter, draft.model.layers[1]


def _eagle(target, draft, head):
    return eagle_drafter(head, DynamicTree(depth=3, top_k=2, budget=5)), head.layers[0].mlp


def _static_eagle(target, draft, head):
    drafter = static_drafting(eagle_drafter(head, Chain(3)), compile=False, min_cache_length=96)
    return drafter, head.layers[0].mlp


def _medusa(target, draft, head=None):
    torch.manual_seed(3)
    heads = MedusaHeads.from_target(target, num_heads=3)
    return TreeDrafter(MedusaDraftModel(heads), heads.default_tree()), heads


def _mtp(target, draft, head=None):
    torch.manual_seed(4)
    head = MTPHead.from_target(target)
    return TreeDrafter(MTPDraftModel(head), Chain(3)), head.block


def _union(target, draft, head=None):
    lm = ModelDrafter(draft, tree=Chain(3))
    return UnionDrafter(PromptLookup(num_tokens=3), lm), draft.model.layers[1]


DRAFTERS = {"draft-lm": _draft_lm, "static-draft-lm": _static_draft_lm, "eagle": _eagle,
            "static-eagle": _static_eagle, "medusa": _medusa, "mtp": _mtp, "union": _union}
VERIFIERS = {"eager": lambda model: model, "static": lambda model: StaticTarget(model, compile=False,
                                                                                 min_cache_length=96)}


def _run(verifier, drafter):
    out = speculative_generate(verifier, PROMPT, drafter=drafter, acceptance=Greedy(), max_new_tokens=NEW_TOKENS)
    return out.sequences, list(out.stats.accepted)


# Every drafter with each verifier under an error; the stateful ones under KeyboardInterrupt too (it unwinds the same
# way, but is not an Exception: an `except Exception` clean-up would miss it).
STATEFUL = ("draft-lm", "static-draft-lm", "eagle", "union")
CASES = [(name, verifier, "error") for name in DRAFTERS for verifier in VERIFIERS] + [
    (name, verifier, "interrupt") for name in STATEFUL for verifier in VERIFIERS]
ERRORS = {"error": lambda: Fault("drafter broke"), "interrupt": KeyboardInterrupt}


@pytest.mark.parametrize("name,verifier_name,error", CASES, ids=["-".join(case) for case in CASES])
def test_a_drafter_that_raised_mid_generation_drafts_as_a_fresh_one(trained, draft, name, verifier_name, error):
    target, head = trained
    fresh, _ = DRAFTERS[name](target, draft, head)
    expected = _run(VERIFIERS[verifier_name](target), fresh)
    assert torch.equal(expected[0], target.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False))

    drafter, part = DRAFTERS[name](target, draft, head)
    verifier = VERIFIERS[verifier_name](target)
    for call in (5, 2):  # mid-generation (a few steps in), then early (the first step)
        undo = _fail_on_call(part, call, ERRORS[error]())
        with pytest.raises((Fault, KeyboardInterrupt)):
            _run(verifier, drafter)
        undo()
        again = _run(verifier, drafter)
        assert torch.equal(again[0], expected[0]) and again[1] == expected[1], f"after a failure at call {call}"


@pytest.mark.parametrize("verifier_name", sorted(VERIFIERS))
@pytest.mark.parametrize("error", sorted(ERRORS))
def test_a_target_that_raised_mid_generation_verifies_as_a_fresh_one(target, draft, verifier_name, error):
    expected = _run(VERIFIERS[verifier_name](target), _draft_lm(target, draft)[0])
    drafter, _ = _draft_lm(target, draft)
    verifier = VERIFIERS[verifier_name](target)
    for call in (4, 1):  # a verification a few steps in, then the prefill
        undo = _fail_on_call(target.model.layers[1], call, ERRORS[error]())
        with pytest.raises((Fault, KeyboardInterrupt)):
            _run(verifier, drafter)
        undo()
        again = _run(verifier, drafter)
        assert torch.equal(again[0], expected[0]) and again[1] == expected[1], f"after a failure at call {call}"


def test_ctrl_c_during_generate_leaves_its_session_answering_as_a_fresh_one(tmp_path, target, draft):
    """``specprim.generate`` keeps the built recipe for the next call: a Ctrl-C inside its draft model's forward
    propagates, and the next call answers as a fresh session does."""
    from specprim import _generate

    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
    recipe = Recipe(method="leviathan", draft=str(tmp_path / "draft"), verifier="static", num_draft=3)
    ask = functools.partial(_generate.generate, "t5 t6 t7 t5 t6", target=str(tmp_path / "target"), recipe=recipe,
                            max_new_tokens=NEW_TOKENS)
    _generate._session.cache_clear()
    try:
        _, built = _generate._session(str(tmp_path / "target"), recipe)  # what generate() will use
        draft_lm = built.method.drafter.model.model  # ModelDrafter -> LMDraftModel -> the loaded draft model
        undo = _fail_on_call(draft_lm.model.layers[1], 5, KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            ask()
        undo()
        again = ask()
        _generate._session.cache_clear()
        fresh = ask()
    finally:
        _generate._session.cache_clear()
    assert again.text == fresh.text and again.output.stats.accepted == fresh.output.stats.accepted
    assert torch.equal(again.output.sequences, fresh.output.sequences)
