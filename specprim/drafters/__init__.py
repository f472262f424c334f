"""Drafters: propose a DraftTree and keep their own state.

Model-based drafters are a `TreeDraftModel` (what predicts the next token) plus a tree builder from
`specprim.trees` (the shape), combined by `TreeDrafter`.
"""

from specprim._types import DraftRequest, TargetFeatures
from specprim.drafters._base import Drafter
from specprim.drafters._checkpoint import head_classes, read_head_config
from specprim.drafters._cross_vocab import CrossVocab
from specprim.drafters._cross_vocab_lm import CrossVocabDraftModel
from specprim.drafters._datastore import Datastore, DatastoreLookup, tokenizer_fingerprint
from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._eagle_draft import EagleDraftModel, eagle_drafter
from specprim.drafters._eagle_head import EagleConfig, EagleHead, EagleOutput, default_feature_layers
from specprim.drafters._eagle_static import StaticEagleDraftModel
from specprim.drafters._early_exit import EarlyExit
from specprim.drafters._medusa import MedusaConfig, MedusaDraftModel, MedusaHeads, default_medusa_tree
from specprim.drafters._model import ModelDrafter, lm_draft_vocab
from specprim.drafters._mtp import MTPConfig, MTPDraftModel, MTPHead
from specprim.drafters._parallel import ParallelDraftModel, ParallelHead
from specprim.drafters._prompt_lookup import PromptLookup
from specprim.drafters._static import static_drafting
from specprim.drafters._static_draft_lm import StaticLMDraftModel
from specprim.drafters._suffix import SuffixDecoding
from specprim.drafters._tree_drafter import TreeDrafter, TreeShaped
from specprim.drafters._union import UnionDrafter
from specprim.drafters._vocab import (
    check_d2t,
    count_tokens,
    draft_vocab,
    scatter_to_target,
    target_mask,
    target_to_draft,
)

__all__ = [
    "CrossVocab",
    "Datastore",
    "DatastoreLookup",
    "DraftRequest",
    "Drafter",
    "EagleConfig",
    "EagleDraftModel",
    "EagleHead",
    "EarlyExit",
    "LMDraftModel",
    "MTPConfig",
    "MTPDraftModel",
    "MTPHead",
    "MedusaConfig",
    "MedusaDraftModel",
    "MedusaHeads",
    "ModelDrafter",
    "ParallelDraftModel",
    "ParallelHead",
    "PromptLookup",
    "StaticLMDraftModel",
    "SuffixDecoding",
    "TargetFeatures",
    "TreeDrafter",
    "UnionDrafter",
    "draft_vocab",
    "static_drafting",
    "eagle_drafter",
    "lm_draft_vocab",
]
