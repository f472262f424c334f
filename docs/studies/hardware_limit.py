"""How close a target forward runs to this machine's memory-bandwidth limit.

A decoding step of a small model on a CPU reads every weight once; with few query tokens it does little arithmetic
per byte, so the time to stream the weights from memory bounds the step from below. This script measures, with
``--threads`` threads:

1. **read bandwidth**: the best of several ``sum`` reductions over a buffer far larger than the caches (GB/s);
2. **weight bytes** one forward streams: every linear layer's weight (the LM head included; the embedding table is
   only gathered from), and the **floor** = bytes / bandwidth;
3. **linear layers alone**: every linear of the model applied in turn to ``R`` rows (``R`` = 1, 8, 16), with the
   kernels the model uses (packed oneDNN weights with ``--pack``; with ``--static``, ``q/k/v`` and ``gate/up``
   concatenated, as the compiled verifier multiplies them);
4. **attention alone**: every layer's ``scaled_dot_product_attention`` as transformers calls it (key/value heads
   repeated for grouped-query attention, an additive mask) over a static cache of ``--cache-length`` slots (what
   ``StaticTarget`` attends over: its cache is a multiple of 512), compiled;
5. **the whole forward** at 1, 8 and 16 query tokens after a 100-token context, the fastest of ``--repeats``
   (``docs/studies/forward_costs.py``'s timing; eager, or ``--static`` through a
   compiled ``StaticTarget``, which takes minutes of compiling; it pads 1 query token to 2).

The table shows each in milliseconds and as a multiple of the floor; what the whole forward costs above the linear
layers is attention, norms, activations, cache writes and per-operator overhead.

    python docs/studies/hardware_limit.py --pack              # add --static for the compiled verifier
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from forward_costs import forward_ms, static_forward_ms  # docs/studies/forward_costs.py, beside this script
from torch import nn

from specprim import models
from specprim.hf import StaticTarget
from specprim.models import PackedLinear

ROWS = (1, 8, 16)
PAST = 100  # context tokens before the timed forwards
PADDED = {1: 2, 8: 8, 16: 16}  # query tokens -> what StaticTarget pads them to (its smallest bucket is 2)


def best_ms(run: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``run`` (after one untimed call), in milliseconds."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def read_bandwidth_gbs(megabytes: int, repeats: int) -> float:
    """Read bandwidth in GB/s: the fastest ``sum`` over an fp32 buffer of ``megabytes`` MB."""
    buffer = torch.ones(megabytes * 2**20 // 4)  # (megabytes MiB / 4 bytes,) fp32
    ms = best_ms(lambda: buffer.sum(), repeats)
    return buffer.numel() * 4 / (ms / 1000) / 1e9


CONCATENATED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Linears that read the same input, which the compiled verifier multiplies as one (inductor's concat-linear pass)."""


def linear_layers(model: nn.Module, *, concatenate: bool) -> list[nn.Module]:
    """The model's linear layers (packed or not), each once; with ``concatenate``, each group of
    :data:`CONCATENATED` siblings is replaced by one layer of their stacked weights (packed if they were)."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    if not concatenate:
        return layers
    for parent in model.modules():
        for names in CONCATENATED:
            group = [getattr(parent, name, None) for name in names]
            if all(isinstance(layer, (nn.Linear, PackedLinear)) for layer in group):
                joined = nn.Linear(group[0].in_features, sum(layer.out_features for layer in group), bias=False)
                with torch.no_grad():
                    joined.weight.copy_(torch.cat([layer.weight for layer in group]))  # (sum N, K)
                joined = joined.to(torch.bfloat16).requires_grad_(False)
                layers = [layer for layer in layers if all(layer is not g for g in group)]
                layers.append(PackedLinear(joined) if isinstance(group[0], PackedLinear) else joined)
    return layers


def weight_bytes(layers: list[nn.Module]) -> int:
    """Bytes of the weights (and biases) ``layers`` read per forward."""
    return sum(p.numel() * p.element_size() for layer in layers for p in (layer.weight, layer.bias) if p is not None)


def linears_ms(layers: list[nn.Module], rows: int, repeats: int) -> float:
    """Milliseconds to apply every layer once to ``rows`` random bfloat16 rows (the model's own kernels)."""
    inputs = [torch.randn(rows, layer.in_features, dtype=torch.bfloat16) for layer in layers]  # (R, K) each

    def run() -> None:
        for layer, x in zip(layers, inputs, strict=True):
            layer(x)

    with torch.no_grad():
        return best_ms(run, repeats)


def attention_ms(config, queries: int, cache_length: int, repeats: int) -> float:  # noqa: ANN001 - a model config
    """Milliseconds of one compiled pass of every layer's attention for ``queries`` rows over ``cache_length`` slots
    (the first 100 visible), with the key/value heads repeated to the query heads as transformers does."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    layers = config.num_hidden_layers
    query = [torch.randn(1, heads, queries, dim, dtype=torch.bfloat16) for _ in range(layers)]  # (1, h, Q, d) each
    keys = [torch.randn(1, kv_heads, cache_length, dim, dtype=torch.bfloat16) for _ in range(layers)]  # (1, g, L, d)
    values = [torch.randn(1, kv_heads, cache_length, dim, dtype=torch.bfloat16) for _ in range(layers)]
    mask = torch.full((1, 1, queries, cache_length), float("-inf"), dtype=torch.bfloat16)  # (1, 1, Q, L) additive
    mask[..., :100] = 0

    def repeated(x: torch.Tensor) -> torch.Tensor:  # (1, g, L, d) -> (1, h, L, d)
        return x[:, :, None].expand(1, kv_heads, heads // kv_heads, cache_length, dim).reshape(1, heads, -1, dim)

    def attend() -> list[torch.Tensor]:
        return [F.scaled_dot_product_attention(q, repeated(k), repeated(v), attn_mask=mask)
                for q, k, v in zip(query, keys, values, strict=True)]

    compiled = torch.compile(attend, fullgraph=True, dynamic=False)
    with torch.no_grad():
        return best_ms(compiled, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--pack", action="store_true", help="packed oneDNN bfloat16 weights (as --pack in bench)")
    parser.add_argument("--static", action="store_true", help="time the forward through a compiled StaticTarget")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--buffer-mb", type=int, default=1024, help="size of the bandwidth probe's buffer")
    parser.add_argument("--cache-length", type=int, default=512, help="slots the attention timing attends over")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    bandwidth = read_bandwidth_gbs(args.buffer_mb, args.repeats)
    model, _ = models.load(args.target, dtype=torch.bfloat16, pack=args.pack)
    layers = linear_layers(model, concatenate=args.static)
    floor_ms = weight_bytes(layers) / (bandwidth * 1e9) * 1000
    context = torch.randint(0, model.config.vocab_size, (1, PAST + 1), generator=torch.Generator().manual_seed(0))
    forward = partial(static_forward_ms, StaticTarget(model)) if args.static else partial(forward_ms, model)

    kind = ("compiled static" if args.static else "eager") + (", packed weights" if args.pack else "")
    print(f"{args.target}, bfloat16, {kind}, {args.threads} threads")
    print(f"read bandwidth {bandwidth:.1f} GB/s; linear weights {weight_bytes(layers) / 1e6:.0f} MB in "
          f"{len(layers)} layers{' (as the compiled verifier concatenates them)' if args.static else ''}; "
          f"floor {floor_ms:.1f} ms per forward (plain decoding <= {1000 / floor_ms:.0f} tok/s)")
    print(f"| query tokens | linear layers ms | x floor | attention ms ({args.cache_length} slots) | whole forward ms "
          "| x floor | rest of the forward |")
    print("|---|---|---|---|---|---|---|")
    for rows in ROWS:
        linear = linears_ms(layers, rows, args.repeats)
        attended = PADDED[rows] if args.static else rows  # the static verifier pads 1 token to 2
        attention = attention_ms(model.config, attended, args.cache_length, args.repeats)
        forward(context, PAST, rows, 1)  # warm-up (compiles with --static)
        whole = forward(context, PAST, rows, args.repeats, best=True)
        print(f"| {rows} | {linear:.1f} | {linear / floor_ms:.2f} | {attention:.1f} | {whole:.1f} | "
              f"{whole / floor_ms:.2f} | {(whole - linear) / whole:.0%} |", flush=True)


if __name__ == "__main__":
    main()
