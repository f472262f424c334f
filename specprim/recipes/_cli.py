"""The command-line options that name a :class:`Recipe`, declared once for ``generate``, ``bench`` and ``tune``.

Every option defaults to "not given" (``argparse.SUPPRESS``), so :func:`recipe_from_args` knows which ones the
user typed: those replace the fields of the base recipe (``--recipe NAME|FILE``, ``auto``'s choice, or the
defaults), and nothing else does.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from specprim import models
from specprim._names import DTYPES, QUANTIZE_SCHEMES, TREE_SPEC_HELP, VERIFIERS
from specprim._usage import as_usage_error
from specprim.models import check_model

if TYPE_CHECKING:
    from specprim.recipes._recipe import Recipe


def _acceptance_rule(name: str) -> str:
    """``--acceptance``: a name of :data:`specprim.acceptance.RULES` (imported only when the option is given)."""
    from specprim.acceptance import RULES

    if name not in RULES:
        raise argparse.ArgumentTypeError(f"unknown rule {name!r}; choose from {', '.join(RULES)}")
    return name


# option -> (Recipe field, argparse keyword arguments)
_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "--dtype": ("dtype", dict(choices=DTYPES, help="the models' dtype (default float32; auto: the recipe's)")),
    "--quantize": ("quantize", dict(choices=QUANTIZE_SCHEMES,
                                    help="weight-only quantize the target's linear layers (the baseline runs the "
                                         "same model)")),
    "--pack": ("pack", dict(action="store_true",
                            help="pre-pack the bfloat16 models' linears for oneDNN on CPU (same values, faster)")),
    "--compile": ("compile", dict(action="store_true",
                                  help="torch.compile the models' forward (not with --pack; compiles first)")),
    "--verifier": ("verifier", dict(choices=VERIFIERS,
                                    help="eager (the model's forward), static (static KV cache, padded trees) or "
                                         "compiled (static, torch.compiled: the fast CPU path, compiles first)")),
    "--static-verify": ("verifier", dict(action="store_const", const="compiled",
                                         help="the same as --verifier compiled")),
    "--min-padded": ("min_padded", dict(type=int, help="the static verifier pads trees to at least this many tokens "
                                                         "(one compiled shape for all small trees)")),
    "--static-draft": ("static_draft", dict(action="store_true",
                                            help="draft through static, compiled draft LMs and EAGLE heads")),
    "--draft": ("draft", dict(help="draft model for leviathan (a known name, path or hub id)")),
    "--draft-quantize": ("draft_quantize", dict(choices=QUANTIZE_SCHEMES,
                                                help="weight-only quantize the --draft model's linear layers")),
    "--draft-vocab": ("draft_vocab", dict(type=int, help="restrict leviathan's --draft model to this many ids")),
    "--head": ("head", dict(help="trained head (directory or shipped name) for medusa / eagle / eagle3 / mtp; "
                                 "default: the one shipped for the target")),
    "--exit-layer": ("exit_layer", dict(type=int, help="exit layer for early-exit (default: half the layers)")),
    "--num-draft": ("num_draft", dict(type=int, help="draft tokens per step (default: the preset's)")),
    "--tree": ("tree", dict(help=f"replace the presets' tree shape: {TREE_SPEC_HELP} (see specprim tune)")),
    "--max-nodes": ("max_nodes", dict(type=int, help="cap a union's merged tree (methods joined by '+')")),
    "--datastore": ("datastores", dict(action="append",
                                       help="the corpus of a datastore part (repeatable): a shipped name "
                                            "(smollm2-135m-instruct-answers; sharegpt, built on first use) or a "
                                            "file written by Datastore.save")),
    "--acceptance": ("acceptance", dict(type=_acceptance_rule,
                                        help="acceptance rule: speculative (default), greedy, typical (lossy), "
                                             "block (chains), traversal (trees)")),
    "--warmup-tokens": ("warmup_tokens", dict(type=int, help="tokens generated before timing (compiles first)")),
}


def add_recipe_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add ``--recipe`` and every recipe option but those in ``skip`` (e.g. ``("--tree",)``) to ``parser``."""
    group = parser.add_argument_group("recipe", "how the models load, verify and draft (see docs/recipes.md)")
    group.add_argument("--recipe", default=argparse.SUPPRESS,
                       help="a shipped recipe (e.g. smollm2-135m-instruct-eagle3:greedy) or a TOML file; the "
                            "options below replace its fields")
    unknown = set(skip) - set(_OPTIONS)
    if unknown:
        raise ValueError(f"not recipe options: {sorted(unknown)}")
    for option, (_field, kwargs) in _OPTIONS.items():
        if option in skip:
            continue
        group.add_argument(option, dest=option.removeprefix("--").replace("-", "_"), default=argparse.SUPPRESS,
                           **kwargs)


def given_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe fields the user typed on the command line, by field name."""
    fields: dict[str, Any] = {}
    for option, (field, _) in _OPTIONS.items():
        dest = option.removeprefix("--").replace("-", "_")
        if hasattr(args, dest):
            value = getattr(args, dest)
            fields[field] = tuple(value) if field == "datastores" else value
    return fields


def check_recipe_sources(fields: Mapping[str, Any]) -> None:
    """Refuse (:class:`specprim._usage.UsageError`) recipe fields that name something that is not there: ``head``
    (a shipped head or a directory), a ``datastores`` entry (a known datastore or a file) or ``draft`` (a path with
    no directory). ``fields``: :func:`given_fields` or ``recipe.changes()``."""
    with as_usage_error():
        if fields.get("head") is not None:
            models.head_path(fields["head"])
        for name in fields.get("datastores", ()):
            if name not in models.known_datastores():
                models.datastore_path(name)
    check_model("--draft", fields.get("draft"))


def recipe_from_args(args: argparse.Namespace, base: Recipe, method: str | None = None) -> Recipe:
    """``base`` with the fields the user typed (and ``method``, when given) replaced; ``ValueError`` when the
    result is not a valid recipe."""
    fields = given_fields(args)
    if method is not None:
        fields["method"] = method
    return dataclasses.replace(base, **{**_untyped_conflicts(base, fields), **fields})


def _untyped_conflicts(base: Recipe, fields: dict[str, Any]) -> dict[str, Any]:
    """Base fields that only made sense with a value the user replaced, reset to their defaults unless the user
    typed them too: ``--verifier eager`` drops the static verifier's ``min_padded``, a dtype other than bfloat16
    drops ``pack``, and a method without a union or a datastore drops ``max_nodes`` or ``datastores``."""
    from specprim.recipes._recipe import Recipe

    verifier = fields.get("verifier", base.verifier)
    parts = fields.get("method", base.method).split("+")
    resets = {"min_padded": verifier == "eager", "pack": fields.get("dtype", base.dtype) != "bfloat16",
              "max_nodes": len(parts) == 1, "datastores": "datastore" not in parts}
    defaults = Recipe()
    return {name: getattr(defaults, name) for name, reset in resets.items() if reset and name not in fields}
