"""The registry of trained-draft kinds (``specprim.train._kinds``): it names exactly the command line's kinds, each
entry builds an objective that trains the kind's module, a new kind takes one entry, and ``load_head`` finds every
head class through ``register_head``."""

from pathlib import Path

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm

from specprim._names import LAYERED_TRAIN_KINDS, TRAIN_KINDS, UNROLLED_TRAIN_KINDS
from specprim.drafters import EagleHead, MedusaHeads, MTPHead, ParallelHead, head_classes
from specprim.models import load_head
from specprim.train import (
    DistillObjective,
    EagleObjective,
    Example,
    FeatureDataset,
    MedusaObjective,
    MTPObjective,
    ObjectiveOutput,
    ParallelObjective,
    build_feature_cache,
)
from specprim.train._kinds import REGISTRY, TrainKind
from specprim.train._pipeline import build_objective, feature_layers_for

LAYERS = 2


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0)


@pytest.fixture(scope="module")
def dataset(target, tmp_path_factory):
    ids = torch.randint(2, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
    examples = [Example(row, torch.arange(len(row)) >= 4) for row in ids]
    directory = tmp_path_factory.mktemp("features")
    build_feature_cache(target, examples, directory, layers=range(LAYERS + 1), top_k=4, progress=False)
    return FeatureDataset(directory, batch_tokens=64, max_length=12, holdout=0)


def test_the_registry_names_the_command_lines_kinds_in_order():
    assert tuple(REGISTRY) == TRAIN_KINDS
    assert all(isinstance(kind, TrainKind) for kind in REGISTRY.values())
    assert UNROLLED_TRAIN_KINDS == tuple(name for name, kind in REGISTRY.items() if kind.unrolled)
    assert LAYERED_TRAIN_KINDS == tuple(name for name, kind in REGISTRY.items() if kind.resize is not None)


EXPECTED = {"eagle3": (EagleObjective, EagleHead), "eagle": (EagleObjective, EagleHead),
            "medusa": (MedusaObjective, MedusaHeads), "mtp": (MTPObjective, MTPHead),
            "distill": (DistillObjective, type(tiny_causal_lm("llama", seed=1))),
            "parallel": (ParallelObjective, ParallelHead)}


@pytest.mark.parametrize("kind", TRAIN_KINDS)
def test_each_kind_builds_its_objective_over_its_module(kind, target, dataset, tmp_path):
    draft = tiny_causal_lm("llama", seed=1) if kind == "distill" else None
    objective = build_objective(kind, target, dataset, draft=draft, num_heads=2)
    objective_class, module_class = EXPECTED[kind]
    assert type(objective) is objective_class and type(objective.module) is module_class
    assert set(objective.layers) <= set(feature_layers_for(kind, target))
    batch = dataset.load(dataset.batches(0)[0])
    out = objective(batch)
    assert isinstance(out, ObjectiveOutput) and out.loss.requires_grad and "acc_1" in out.metrics
    if kind != "distill":  # a saved head continues training as the same kind, and as no other
        objective.save_pretrained(tmp_path / "head")
        again = build_objective(kind, target, dataset, init_from=tmp_path / "head")
        assert type(again.module) is module_class
        other = "medusa" if kind != "medusa" else "mtp"
        with pytest.raises(ValueError, match=f"not a '{other}' head"):
            build_objective(other, target, dataset, init_from=tmp_path / "head")


def test_the_registry_refuses_what_a_kind_cannot_do(target, dataset, tmp_path):
    with pytest.raises(ValueError, match="unknown kind 'eagle2'"):
        build_objective("eagle2", target, dataset)
    with pytest.raises(ValueError, match=r"align trains unrolled draft depths \(eagle3, eagle, mtp, parallel\); 'med"):
        build_objective("medusa", target, dataset, align=True)
    with pytest.raises(ValueError, match="needs a draft model"):
        build_objective("distill", target, dataset)
    with pytest.raises(ValueError, match="init_from does not apply"):
        build_objective("distill", target, dataset, draft=tiny_causal_lm("llama", seed=1), init_from=tmp_path)
    with pytest.raises(ValueError, match=r"head_layers sets the decoder layers of eagle3, eagle heads \(>= 1\); got 2 "
                                         "for 'medusa'"):
        build_objective("medusa", target, dataset, head_layers=2)
    with pytest.raises(ValueError, match="got 0 for 'eagle3'"):
        build_objective("eagle3", target, dataset, head_layers=0)


def test_head_layers_and_draft_vocab_size_resize_a_saved_eagle_head(target, dataset, tmp_path):
    fresh = build_objective("eagle3", target, dataset, head_layers=2)
    assert fresh.module.config.num_layers == 2
    build_objective("eagle3", target, dataset, draft_vocab_size=40).save_pretrained(tmp_path / "one")
    assert build_objective("eagle3", target, dataset, init_from=tmp_path / "one").module.config.num_layers == 1
    grown = build_objective("eagle3", target, dataset, init_from=tmp_path / "one", head_layers=3).module
    saved = load_head(tmp_path / "one", target)
    assert grown.config.num_layers == 3
    torch.testing.assert_close(grown.layers[0].state_dict(), saved.layers[0].state_dict())
    assert not grown.layers[2].mlp.down_proj.weight.detach().any()  # an added layer starts as the identity
    wide = build_objective("eagle3", target, dataset, init_from=tmp_path / "one", head_layers=2,
                           draft_vocab_size=saved.config.draft_vocab_size + 8).module
    assert wide.config.num_layers == 2 and wide.config.draft_vocab_size == saved.config.draft_vocab_size + 8
    assert set(saved.d2t.tolist()) < set(wide.d2t.tolist())
    with pytest.raises(ValueError, match="cannot be widened"):
        build_objective("eagle3", target, dataset, init_from=tmp_path / "one", draft_vocab_size=4)
    fresh.save_pretrained(tmp_path / "two")
    with pytest.raises(ValueError, match="2 decoder layers cannot be grown to 1"):
        build_objective("eagle3", target, dataset, init_from=tmp_path / "two", head_layers=1)


def test_a_new_kind_is_one_registry_entry(target, dataset, monkeypatch):
    """A kind whose module is a plain linear map of the last hidden state, trained by an objective of its own."""

    class LinearObjective(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.layers = module, (LAYERS,)

        def forward(self, batch):
            loss = self.module(batch.feature(LAYERS)).square().mean()
            return ObjectiveOutput(loss=loss, metrics={"loss": float(loss)})

        def save_pretrained(self, directory):
            torch.save(self.module.state_dict(), Path(directory) / "linear.pt")

    hidden = int(target.config.hidden_size)
    entry = TrainKind(fresh=lambda inputs: torch.nn.Linear(hidden, 3), objective=lambda m, _: LinearObjective(m),
                      own_layers=lambda num_layers: (0,))
    monkeypatch.setitem(REGISTRY, "linear", entry)
    objective = build_objective("linear", target, dataset)
    assert isinstance(objective, LinearObjective) and objective.module.out_features == 3
    assert feature_layers_for("linear", target) == (0, LAYERS)


def test_load_head_finds_every_registered_head_class(target, tmp_path):
    assert {"EagleHead", "MedusaHeads", "MTPHead"} <= set(head_classes())
    for i, head in enumerate((EagleHead.from_target(target, version=3), MedusaHeads.from_target(target, num_heads=2),
                              MTPHead.from_target(target))):
        head.save_pretrained(tmp_path / str(i))
        assert type(load_head(tmp_path / str(i), target)) is type(head)
