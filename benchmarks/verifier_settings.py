"""What one of the compiled static verifier's settings saves: an interleaved A/B in one process.

``specprim.hf.compiled_settings`` holds the settings a compiled ``StaticTarget`` runs under. Two of them are
measured here, each against the same settings with it switched off:

* ``concat-linear``: inductor's ``cpp.enable_concat_linear``; under freezing, linears that read the same input (a
  Llama layer's ``q/k/v`` and ``gate/up`` projections) become one matrix product each, 4 instead of 7 per layer;
* ``gqa``: attention on the key/value heads as they are (``enable_gqa`` in ``scaled_dot_product_attention``)
  instead of transformers repeating them to the query heads, which it does whenever a mask is passed;
* ``window``: attention over the cache slots up to the last one written (``specprim.hf.windowed_attention``)
  instead of over the whole static cache (512 slots here);
* ``cpp-gemm``: forwards of at most ``CPP_GEMM_MAX_TOKENS`` (4) padded tokens multiplying through inductor's C++ GEMM
  template instead of oneDNN (``--cpp-gemm-max-tokens 16`` times the template at every size).
* ``int4-gemm``: int4 weights on both sides; forwards of every size multiplying through the C++ GEMM template (what
  ``compiled_settings(..., gemm_template=True)`` does) instead of only those of at most ``CPP_GEMM_MAX_TOKENS``;
* ``guard-skip``: dynamo's guards checked in full, and the compile settings entered, only on a shape's first call
  (``specprim.hf.WarmShapes``), against at every call;
* ``int8-all``, ``int4``, ``int4-all``: not a compiled setting but the weights: linear layers weight-only quantized
  (``models.load(..., quantize=...)``; ``int4`` keeps the LM head, packed) against packed bf16 ones, under the same
  compiled settings.

The script loads the target twice (so that each copy compiles its own graphs), compiles a ``StaticTarget`` for each,
one with the setting and one without, checks that both pick the same tokens, and times verification of 1, 4, 8 and
16 tokens alternating between the two (the median of 6 rounds of 8 forwards each), so that the machine's drift
affects both alike. Compiling takes ~10 minutes on 2 cores.

    python benchmarks/verifier_settings.py --setting concat-linear  # or gqa, window, cpp-gemm, int8-all, int4, int4-all
    python benchmarks/verifier_settings.py --setting window --past 250  # the context length before the tokens
    python benchmarks/verifier_settings.py --setting int4-gemm --sizes 8 16 64  # the verified sizes to time
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any
from unittest import mock

import torch
from torch._inductor import config as inductor_config
from transformers import PretrainedConfig

from specprim import DraftTree, models
from specprim.hf import StaticTarget, _static_target

SIZES = (1, 4, 8, 16)
QUANTIZED = ("int8-all", "int4", "int4-all")
_settings = _static_target.compiled_settings
_windowed_attention = _static_target.windowed_attention
_attends_windowed = _static_target.attends_windowed
_switched_on = {"on": True}


def _off(setting: str) -> contextlib.AbstractContextManager[None]:
    """What switches ``setting`` off inside specprim's compiled settings."""
    if setting == "concat-linear":
        return inductor_config.patch({"cpp.enable_concat_linear": False})
    if setting == "cpp-gemm":
        return mock.patch.object(_static_target, "CPP_GEMM_MAX_TOKENS", 0)
    return mock.patch.dict(os.environ, {_static_target.FORCE_GQA: "0"})


@contextlib.contextmanager
def _switchable_window(config: PretrainedConfig) -> Iterator[bool]:
    """specprim's windowed attention when ``_switched_on["on"]``, else the whole cache on the model's own attention."""
    with _windowed_attention(config) if _switched_on["on"] else contextlib.nullcontext(False) as windowed:
        yield windowed


def _switchable_settings(setting: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    """specprim's compiled settings, with ``setting`` on or off as ``_switched_on["on"]`` says."""

    @contextlib.contextmanager
    def settings(device_type: str = "cpu", tokens: int | None = None, *,
                 gemm_template: bool | None = None) -> Iterator[None]:
        on = _switched_on["on"]
        if setting == "int4-gemm":  # off: the template by size, as for bf16 weights
            with _settings(device_type, tokens, gemm_template=gemm_template if on else None):
                yield
            return
        with contextlib.nullcontext() if on else _off(setting), _settings(device_type, tokens,
                                                                          gemm_template=gemm_template):
            yield

    return settings


class _AlwaysCold:
    """A ``WarmShapes`` that never skips dynamo's guards (nor the compile settings)."""

    def call(self, key: Hashable, function: Callable[..., Any], *args: Any,
             settings: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> Any:
        with settings():
            return function(*args)


def verify_ms(verifier: StaticTarget, setting_on: bool, context: torch.Tensor, queries: int, repeats: int,
              past: int) -> tuple[float, torch.Tensor]:
    """Mean milliseconds of verifying ``queries`` tokens (root + a chain) after ``context[:, :past]``, and the logits
    (1, queries, V) of the last forward."""
    _switched_on["on"] = setting_on
    tree = DraftTree(tokens=context[:, past + 1 : past + queries], parents=torch.arange(queries - 1) - 1)
    verifier.start(context[:, : past + 1])
    start = time.perf_counter()
    for _ in range(repeats):
        logits, _ = verifier.verify(context[:, past], tree)
        verifier.past_length = past
    return (time.perf_counter() - start) / repeats * 1000, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=["concat-linear", "gqa", "window", "cpp-gemm", "int4-gemm", "guard-skip",
                                              *QUANTIZED],
                        required=True)
    parser.add_argument("--cpp-gemm-max-tokens", type=int, default=_static_target.CPP_GEMM_MAX_TOKENS,
                        help="with --setting cpp-gemm: the largest padded size that uses the template")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--past", type=int, default=100, help="context tokens before the verified ones (< 480)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="verified tokens per forward (<= 64)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _static_target.CPP_GEMM_MAX_TOKENS = args.cpp_gemm_max_tokens
    weights = {False: {"pack": True}, True: {"pack": True}}
    if args.setting == "window":  # StaticTarget looks both up at every call (the first one when it compiles)
        _static_target.windowed_attention = _switchable_window
        _static_target.attends_windowed = lambda config: _switched_on["on"] and _attends_windowed(config)
    elif args.setting in QUANTIZED:  # the same settings, other weights
        weights[True] = {"quantize": args.setting, "pack": not args.setting.endswith("-all")}
    elif args.setting != "guard-skip":  # guard-skip: the same settings, one verifier checking every guard (below)
        _static_target.compiled_settings = _switchable_settings(args.setting)
    if args.setting == "int4-gemm":  # int4 weights on both sides
        weights = {on: {"quantize": "int4", "pack": True} for on in (False, True)}
    verifiers = {setting_on: StaticTarget(models.load(args.target, dtype=torch.bfloat16, **weights[setting_on])[0])
                 for setting_on in (False, True)}
    if args.setting == "guard-skip":
        verifiers[False]._warm = _AlwaysCold()
    vocab = verifiers[False].vocab_size
    context = torch.randint(0, vocab, (1, args.past + 70), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for queries in args.sizes:
        logits = {on: verify_ms(v, on, context, queries, 1, args.past)[1] for on, v in verifiers.items()}
        same = torch.equal(logits[False].argmax(-1), logits[True].argmax(-1))
        print(f"{queries} tokens: same argmax {same}, max |logit difference| "
              f"{(logits[False] - logits[True]).abs().max().item():.3g}")
    print(f"{args.target}, bfloat16, {args.threads} threads, {args.setting}, {args.past} tokens before; compiled in "
          f"{time.perf_counter() - start:.0f} s")
    times: dict[tuple[int, bool], list[float]] = {(q, c): [] for q in args.sizes for c in (False, True)}
    for round_ in range(args.rounds):
        for queries in args.sizes:
            for on in (False, True) if round_ % 2 else (True, False):
                times[(queries, on)].append(verify_ms(verifiers[on], on, context, queries, 8, args.past)[0])
    print(f"| tokens | without {args.setting} ms | with {args.setting} ms | ratio |")
    print("|---|---|---|---|")
    for queries in args.sizes:
        without, with_ = statistics.median(times[(queries, False)]), statistics.median(times[(queries, True)])
        print(f"| {queries} | {without:.1f} | {with_:.1f} | {with_ / without:.3f} |")


if __name__ == "__main__":
    main()
