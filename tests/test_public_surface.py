"""The public surface a researcher reads: every ``__all__`` name exists, the total stays near 200, and compile and
cache internals are not part of it."""

from __future__ import annotations

import importlib
import pkgutil

import specprim

INTERNALS = {
    "specprim.hf": ("WarmShapes", "query_bucket", "windowed_sdpa_forward", "QUERY_BUCKETS"),
    "specprim.models": ("ensure_cached", "assemble_gguf", "stock_kernels"),
    "specprim.recipes": ("add_recipe_arguments", "recipe_from_args"),
}


def public_modules():
    names = ["specprim"] + [f"specprim.{m.name}" for m in pkgutil.iter_modules(specprim.__path__)
                            if not m.name.startswith("_")]
    return {name: importlib.import_module(name) for name in names}


def test_every_public_name_exists_and_the_surface_stays_near_200():
    total = 0
    for name, module in public_modules().items():
        exported = getattr(module, "__all__", [])
        assert len(exported) == len(set(exported)), name
        assert [n for n in exported if not hasattr(module, n)] == [], name
        total += len(exported)
    assert total <= 210, f"{total} public names; keep the surface a researcher reads near 200"


def test_compile_and_cache_internals_stay_private():
    modules = public_modules()
    for name, internals in INTERNALS.items():
        exported = set(modules[name].__all__)
        assert exported.isdisjoint(internals), (name, sorted(exported & set(internals)))
        assert all(hasattr(modules[name], n) for n in internals)  # still importable by the packages that use them
    assert "presets" in specprim.__all__ and "recipes" in specprim.__all__
