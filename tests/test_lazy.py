"""``specprim/_lazy.py``: a lazily imported name is read from its home module at every use."""

from __future__ import annotations

import importlib

import pytest


def test_a_lazy_name_follows_its_home_module_after_a_patch_is_undone(monkeypatch):
    bench = importlib.import_module("specprim.bench")
    datasets = importlib.import_module("specprim.bench._datasets")
    original = datasets.load_dataset

    def stand_in(name):
        return []

    with monkeypatch.context() as patch:
        patch.setattr(datasets, "load_dataset", stand_in)
        assert bench.load_dataset is stand_in  # the first use happens under the patch
    assert bench.load_dataset is original  # and does not keep the stand-in once it is undone
    from specprim.bench import load_dataset

    assert load_dataset is original


def test_a_lazy_sub_module_and_an_unknown_name():
    specprim = importlib.import_module("specprim")
    assert specprim.drafters is importlib.import_module("specprim.drafters")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        specprim.nope  # noqa: B018
