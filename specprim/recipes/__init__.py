"""Recipes: every choice of a speculative-decoding run as one frozen value, the recipes shipped with trained heads,
and ``auto``, which picks one for a target.

```python
from specprim import recipes
choice = recipes.auto("smollm2-135m-instruct")             # the tuned recipe, its expected speedup, why
model, tokenizer = recipes.load_target(choice.recipe, "smollm2-135m-instruct")
built = choice.recipe.build(model, tokenizer)              # verifier + drafter + acceptance rule
out = built.generate(input_ids, max_new_tokens=128)
```
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py)
    from specprim.recipes._auto import MODES, Choice, auto, load_recipe, shipped_recipes
    from specprim.recipes._build import Built, load_draft, load_target
    from specprim.recipes._cli import add_recipe_arguments, check_recipe_sources, given_fields, recipe_from_args
    from specprim.recipes._measure import plain_generate
    from specprim.recipes._recipe import DTYPES, VERIFIERS, Recipe

__all__ = [
    "DTYPES",
    "MODES",
    "VERIFIERS",
    "Built",
    "Choice",
    "Recipe",
    "auto",
    "load_draft",
    "load_recipe",
    "load_target",
    "shipped_recipes",
]

__getattr__, __dir__ = lazy_imports(__name__)
