"""Train draft modules for any causal-LM target: data, cached target features, objectives, the training loop.

Pipeline: conversations (:func:`load_conversations`, ShareGPT built in) -> optional self-distillation
(:func:`self_distill`) -> :func:`render` with the target's chat template -> target features cached once on disk
(:func:`build_feature_cache`) -> an objective (:class:`EagleObjective`, :class:`MedusaObjective`,
:class:`MTPObjective`, :class:`DistillObjective`) optimised by :func:`train` on ``accelerate``. The ``specprim
train`` command runs all of it. See ``docs/train.md``.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py)
    from specprim.models import read_jsonl_conversations, sharegpt_conversations
    from specprim.train._campaign_cli import add_campaign_parser
    from specprim.train._cli import add_train_parser
    from specprim.train._data import (
        Example,
        load_conversations,
        render,
        render_all,
    )
    from specprim.train._distill import self_distill
    from specprim.train._features import FeatureBatch, FeatureDataset, build_feature_cache
    from specprim.train._lm import DistillObjective
    from specprim.train._losses import greedy_accuracy, soft_cross_entropy
    from specprim.train._medusa import MedusaObjective
    from specprim.train._objective import EagleObjective, MTPObjective
    from specprim.train._parallel import ParallelObjective
    from specprim.train._pipeline import KINDS, DataConfig, train_drafter
    from specprim.train._protocol import Objective, ObjectiveOutput
    from specprim.train._trainer import TrainConfig, train
    from specprim.train._unrolled import unrolled_mask

__all__ = [
    "DataConfig",
    "DistillObjective",
    "EagleObjective",
    "Example",
    "FeatureBatch",
    "FeatureDataset",
    "MTPObjective",
    "MedusaObjective",
    "Objective",
    "ObjectiveOutput",
    "TrainConfig",
    "build_feature_cache",
    "load_conversations",
    "self_distill",
    "sharegpt_conversations",
    "train",
    "train_drafter",
    "unrolled_mask",
]

__getattr__, __dir__ = lazy_imports(__name__)
