"""Drafters: propose a DraftTree and keep their own state."""

from specprim._types import DraftRequest, TargetFeatures
from specprim.drafters._base import Drafter
from specprim.drafters._model import ModelDrafter
from specprim.drafters._prompt_lookup import PromptLookup

__all__ = ["DraftRequest", "Drafter", "ModelDrafter", "PromptLookup", "TargetFeatures"]
