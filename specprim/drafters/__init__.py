"""Drafters: propose a DraftTree and keep their own state."""

from specprim.drafters._base import Drafter, DraftRequest
from specprim.drafters._model import ModelDrafter
from specprim.drafters._prompt_lookup import PromptLookup

__all__ = ["DraftRequest", "Drafter", "ModelDrafter", "PromptLookup"]
