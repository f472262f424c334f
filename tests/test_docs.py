"""The documentation site builds with `mkdocs build --strict` (broken links, missing API symbols and docstring
warnings fail), every page is in the navigation, and the API reference covers every public sub-package."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SUBPACKAGES = ["acceptance", "bench", "drafters", "hf", "kernels", "masks", "models", "presets", "recipes", "residual",
               "sampling", "speedup", "testing", "trees"]


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _config() -> dict:
    # mkdocs.yml uses a !!python/name tag (the mermaid fence); only the navigation is read here.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_every_page_is_in_the_nav():
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(_nav_pages(_config()["nav"])) == pages


def test_api_reference_covers_every_subpackage():
    for name in SUBPACKAGES:
        page = DOCS / "api" / f"{name}.md"
        assert f"::: specprim.{name}" in page.read_text(), page


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    masks = (site / "api" / "masks" / "index.html").read_text()
    assert "tree_attention_mask" in masks
