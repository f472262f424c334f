"""Checkpoint conversion between specprim's trained heads and the layouts other engines load: EAGLE-3 heads to and
from the EAGLE / SGLang layout (:func:`export_eagle3`, :func:`import_eagle`) and vLLM's ``speculators`` format
(:func:`export_speculators`, :func:`import_speculators`). See ``docs/export.md``."""

from specprim.convert._eagle import export_eagle3, import_eagle
from specprim.convert._speculators import export_speculators, import_speculators

__all__ = ["export_eagle3", "export_speculators", "import_eagle", "import_speculators"]
