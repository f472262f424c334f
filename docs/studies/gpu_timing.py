"""Tree-attention kernel on a CUDA machine, timed: attention micro-benchmark and end to end.

The kernel's correctness (against a float64 SDPA reference, and a broken mask that must fail the same comparison)
is a test, ``tests/test_gpu_kernel.py`` (``pytest -m cuda``); ``benchmarks/gpu.sh`` runs that test, then this script.
Sections (each rewrites ``<out>/gpu_timing.json`` as soon as it finishes, so a run cut short keeps its results):

1. ``attention_bench``: time of one verify-attention call, kernel vs the SDPA path transformers takes today
   (additive 4D mask, repeated KV heads), SmolLM2-135M shapes (9 heads, 3 KV heads, head size 64), tree sizes
   16..128 and prefixes 128..2048, bfloat16 and float32.
2. ``end_to_end``: SmolLM2-135M-Instruct in float32 and bfloat16, greedy, on a few chat prompts:
   ``model.generate``; specprim EAGLE-3 (shipped head) with SDPA; the same with the tree kernel; prompt lookup; the
   static verifier, eager and compiled; EAGLE-3 with ``model.forward = torch.compile(model.forward, dynamic=True)``.
   Tokens per second, mean accepted length, and greedy parity (identical tokens) of every method against
   ``model.generate``.

A time budget (``--budget-s``) skips what would not fit, and says so in the JSON and the printout.

    python docs/studies/gpu_timing.py --out results/               # on a CUDA machine (benchmarks/gpu.sh)
    TRITON_INTERPRET=1 python docs/studies/gpu_timing.py --device cpu --quick    # smoke test of this script on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

MODEL = "smollm2-135m-instruct"
HEAD = "smollm2-135m-instruct-eagle3"
STATIC_CACHE_LENGTH = 1024  # static verifier and drafting caches: longest prompt plus new tokens, with room
PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that returns the n-th Fibonacci number, with a docstring.",
    "List five tips for staying focused while studying, one line each.",
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SECTIONS = ("attention_bench", "end_to_end")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/out",
                        help="output directory (default: $OUT, else benchmarks/out)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu runs the kernel in Triton's interpreter (needs TRITON_INTERPRET=1): a smoke test")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few tokens (smoke test)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (16 with --quick)")
    parser.add_argument("--budget-s", type=float, default=400.0, help="skip sections that would start after this")
    parser.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile runs")
    parser.add_argument("--model", default=MODEL,
                        help=f"end-to-end target: a known name or local path (default {MODEL})")
    parser.add_argument("--random-weights", action="store_true",
                        help="initialize the end-to-end target from its config (seed 0) instead of loading weights: "
                             "for a machine that cannot fetch them (a folder with config and tokenizer is enough); "
                             "parity and step costs stay meaningful, acceptance and speed-ups do not")
    parser.add_argument("--dtypes", nargs="+", default=None, choices=list(DTYPES),
                        help="end-to-end dtypes (default float32 and bfloat16; float32 only with --quick)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    return parser.parse_args(argv)


class Report:
    """Collects results per section, prints them and rewrites ``gpu_timing.json`` after every section."""

    def __init__(self, out_dir: Path, budget_s: float) -> None:
        self.out_dir = out_dir
        self.path = out_dir / "gpu_timing.json"
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def has_time(self, needed_s: float) -> bool:
        return self.elapsed() + needed_s <= self.budget_s

    def save(self, section: str, value: Any) -> None:
        self.data[section] = value
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str))


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n== {title}")
    if not rows:
        print("(nothing)")
        return
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.3f}"
    return "" if value is None else str(value)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median over 5 rounds of the mean time of ``reps`` calls, in milliseconds, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    rounds = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        synchronize(device)
        rounds.append((time.perf_counter() - start) / reps * 1e3)
    return sorted(rounds)[2]


# ------------------------------------------------------------------------------------------------ inputs
def random_parents(num_nodes: int, generator: torch.Generator) -> list[int]:
    """A random topological tree with ``num_nodes`` nodes (node ``i`` below the root or an earlier node)."""
    return [int(torch.randint(-1, i, (1,), generator=generator)) if i else -1 for i in range(num_nodes)]


def block_mask(parents: list[int]) -> torch.Tensor:
    """(1 + N, 1 + N) bool mask of the ``[root] + tree`` block: the verification mask with no prefix, as booleans."""
    from specprim.masks import tree_verification_mask

    return tree_verification_mask(parents, 0)[0, 0] == 0  # (1, 1, Q, Q) additive -> (Q, Q) visible


def random_qkv(shape: dict[str, int], dtype: torch.dtype, device: torch.device, generator: torch.Generator):
    """q (B, H, Q, D), k and v (B, Hkv, P + Q, D) in the (non-contiguous) layout transformers produces."""
    b, h, hkv, q_len, p, d = (shape[k] for k in ("B", "H", "Hkv", "Q", "P", "D"))
    q = torch.randn(b, q_len, h, d, generator=generator).to(device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn(b, p + q_len, hkv, d, generator=generator).to(device=device, dtype=dtype).transpose(1, 2)
    v = torch.randn(b, p + q_len, hkv, d, generator=generator).to(device=device, dtype=dtype).transpose(1, 2)
    return q, k, v


# ------------------------------------------------------------------------------------ 1. attention bench
def attention_bench(device: torch.device, quick: bool, report: Report) -> list[dict[str, Any]]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specprim.kernels import tree_attention
    from specprim.masks import tree_verification_mask

    sizes = [(16, 128), (4, 16)] if quick else [(n, p) for n in (16, 32, 64, 128) for p in (128, 512, 1024, 2048)]
    dtypes = [torch.float32] if quick else [torch.bfloat16, torch.float32]
    reps = 2 if quick else 50
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    gen = torch.Generator().manual_seed(1)
    rows = []
    for dtype in dtypes:
        for n, p in sizes:
            if not report.has_time(30):
                rows.append(dict(dtype=str(dtype).removeprefix("torch."), N=n, P=p, note="skipped: time budget"))
                continue
            parents = random_parents(n, gen)
            q, k, v = random_qkv(dict(B=1, H=9, Hkv=3, Q=n + 1, P=p, D=64), dtype, device, gen)
            tree = block_mask(parents).to(device)  # (Q, Q)
            additive = tree_verification_mask(parents, p, dtype=dtype, device=device)  # (1, 1, Q, P + Q)
            kernel = time_ms(partial(tree_attention, q, k, v, tree, p, scale=0.125), device, reps)
            sdpa = time_ms(partial(sdpa_attention_forward, module, q, k, v, additive, scaling=0.125), device, reps)
            rows.append(dict(dtype=str(dtype).removeprefix("torch."), N=n, P=p, kernel_ms=kernel, sdpa_ms=sdpa,
                             speedup=sdpa / kernel))
    return rows


# ------------------------------------------------------------------------------------------ 2. end to end
def prompt_ids(tokenizer: Any, device: torch.device, quick: bool) -> list[torch.Tensor]:
    """(1, T) chat-formatted ids of each prompt."""
    ids = []
    for text in PROMPTS[:1] if quick else PROMPTS:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt")
        tensor = encoded["input_ids"] if not isinstance(encoded, torch.Tensor) else encoded  # (1, T)
        ids.append(tensor.to(device))
    return ids


class Methods:
    """The generation methods compared end to end, on one loaded model. Each takes (1, T) ids and a number of new
    tokens and returns ((1, T + n) sequences, specprim stats or None)."""

    def __init__(self, model: Any, eos: int | None) -> None:
        self.model = model
        self.eos = eos
        self.compiled_forward = torch.compile(model.forward, dynamic=True)
        self.built: dict[str, Any] = {}

    def hf_generate(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                  eos_token_id=self.eos, pad_token_id=self.eos)
        return out, None

    def specprim_sdpa(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        from specprim import presets

        method = presets.from_name("eagle3", target=self.model, head=HEAD)
        out = method.generate(self.model, ids, max_new_tokens=new, eos_token_id=self.eos)
        return out.sequences, out.stats

    def specprim_prompt_lookup(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        from specprim import presets

        method = presets.from_name("prompt-lookup", target=self.model)
        out = method.generate(self.model, ids, max_new_tokens=new, eos_token_id=self.eos)
        return out.sequences, out.stats

    def specprim_kernel(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        from specprim.kernels import use_tree_kernel

        previous = use_tree_kernel(self.model)
        try:
            return self.specprim_sdpa(ids, new)
        finally:
            self.model.set_attn_implementation(previous)

    def specprim_static(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        return self._recipe_run("static", ids, new)

    def specprim_static_compiled(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        return self._recipe_run("compiled", ids, new)

    def _recipe_run(self, verifier: str, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        """EAGLE-3 through the static verifier (compiled or not) and static drafting, as a recipe builds it; the
        built verifier is kept per kind, so its compiled shapes are reused across prompts."""
        from specprim.recipes import Recipe

        if verifier not in self.built:
            recipe = Recipe(method="eagle3", head=HEAD, verifier=verifier, min_padded=4, static_draft=True,
                            num_draft=3, dtype=str(self.model.dtype).removeprefix("torch."))
            self.built[verifier] = recipe.build(self.model, cache_length=STATIC_CACHE_LENGTH)
        out = self.built[verifier].generate(ids, max_new_tokens=new, eos_token_id=self.eos)
        return out.sequences, out.stats

    def specprim_compiled(self, ids: torch.Tensor, new: int) -> tuple[torch.Tensor, Any]:
        self.model.forward = self.compiled_forward
        try:
            return self.specprim_sdpa(ids, new)
        finally:
            del self.model.forward  # back to the class's forward


def end_to_end(device: torch.device, args: argparse.Namespace, report: Report) -> dict[str, Any]:
    max_new = args.max_new_tokens or (16 if args.quick else 128)
    results: dict[str, Any] = {"max_new_tokens": max_new, "rows": [], "parity": []}
    for dtype_name in args.dtypes or (["float32"] if args.quick else ["float32", "bfloat16"]):
        if not report.has_time(60):
            results["rows"].append(dict(dtype=dtype_name, method="all", note="skipped: time budget"))
            continue
        try:
            _end_to_end_one_dtype(dtype_name, device, args, max_new, results, report)
        except Exception as err:  # e.g. the model could not be fetched: keep the other sections' results
            note = f"error: {type(err).__name__}: {err}"[:300]
            results["rows"].append(dict(dtype=dtype_name, method="all", note=note))
            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _end_to_end_one_dtype(dtype_name: str, device: torch.device, args: argparse.Namespace, max_new: int,
                          results: dict[str, Any], report: Report) -> None:
    model, tokenizer = load_target(args.model, DTYPES[dtype_name], args.random_weights)
    model.to(device)
    prompts = prompt_ids(tokenizer, device, args.quick)
    methods = Methods(model, tokenizer.eos_token_id)
    plan: list[tuple[str, Callable, float]] = [  # name, run, seconds it needs at least
        ("hf_generate", methods.hf_generate, 20),
        ("specprim_eager_sdpa", methods.specprim_sdpa, 20),
        ("specprim_eager_kernel", methods.specprim_kernel, 20),
        ("specprim_prompt_lookup", methods.specprim_prompt_lookup, 20),
    ]
    plan.append(("specprim_static", methods.specprim_static, 30))
    if not args.skip_compile:
        plan.append(("specprim_static_compiled", methods.specprim_static_compiled, 150))
        plan.append(("specprim_compiled_sdpa", methods.specprim_compiled, 150))
    outputs: dict[str, list[torch.Tensor]] = {}
    for name, run, needed in plan:
        row: dict[str, Any] = dict(dtype=dtype_name, method=name)
        if not report.has_time(needed):
            row["note"] = "skipped: time budget"
        else:
            try:
                row.update(_time_method(run, prompts, max_new, device, outputs.setdefault(name, [])))
            except Exception as err:  # record and go on: one broken method must not hide the others
                row["note"] = f"error: {type(err).__name__}: {err}"[:300]
                outputs.pop(name, None)
                traceback.print_exc()
        results["rows"].append(row)
        report.save("end_to_end", results)
    results["parity"].extend(_parity(dtype_name, outputs))
    report.save("end_to_end", results)


def load_target(name: str, dtype: torch.dtype, random_weights: bool) -> tuple[Any, Any]:
    """The end-to-end target and its tokenizer: loaded, or built from its config with seeded random weights."""
    from specprim import models

    if not random_weights:
        return models.load(name, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(name), dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(name)


def _time_method(run: Callable, prompts: list[torch.Tensor], max_new: int, device: torch.device,
                 outputs: list[torch.Tensor]) -> dict[str, Any]:
    """One warm-up generation (compiles, if compiled), then every prompt once; tokens/s over all prompts."""
    synchronize(device)
    start = time.perf_counter()
    run(prompts[0], min(max_new, 16))
    synchronize(device)
    warmup_s = time.perf_counter() - start
    new_tokens, seconds, steps = 0, 0.0, 0
    for ids in prompts:
        synchronize(device)
        start = time.perf_counter()
        sequences, stats = run(ids, max_new)
        synchronize(device)
        seconds += time.perf_counter() - start
        new_tokens += sequences.shape[1] - ids.shape[1]
        steps += stats.steps if stats is not None else sequences.shape[1] - ids.shape[1]
        outputs.append(sequences[0, ids.shape[1]:].cpu())
    return dict(warmup_s=warmup_s, new_tokens=new_tokens, seconds=seconds, tokens_per_s=new_tokens / seconds,
                tau=new_tokens / max(steps, 1))


def _parity(dtype_name: str, outputs: dict[str, list[torch.Tensor]]) -> list[dict[str, Any]]:
    """Greedy parity of every method with ``hf_generate``: identical tokens per prompt, else first mismatch."""
    reference = outputs.get("hf_generate")
    rows = []
    for name, sequences in outputs.items():
        if name == "hf_generate" or reference is None or len(sequences) != len(reference):
            continue
        mismatches = []
        for prompt, (ours, theirs) in enumerate(zip(sequences, reference, strict=True)):
            length = min(len(ours), len(theirs))
            differ = (ours[:length] != theirs[:length]).nonzero()
            if len(ours) != len(theirs) or len(differ):
                first = int(differ[0]) if len(differ) else length
                mismatches.append(f"prompt {prompt}: first difference at token {first}")
        rows.append(dict(dtype=dtype_name, method=name, identical_to_hf_generate=not mismatches,
                         detail="; ".join(mismatches)))
    return rows


# ------------------------------------------------------------------------------------------------- main
def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    from specprim.kernels import triton_available

    info: dict[str, Any] = dict(python=platform.python_version(), torch=torch.__version__,
                                transformers=transformers.__version__, device=str(device),
                                triton_interpret=os.environ.get("TRITON_INTERPRET", ""), argv=sys.argv[1:])
    if triton_available():
        import triton

        info["triton"] = triton.__version__
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available; run with --device cpu (and TRITON_INTERPRET=1) for a smoke test")
        return 2
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("--device cpu runs the kernel in Triton's interpreter: set TRITON_INTERPRET=1 in the environment")
        return 2
    from specprim.kernels import triton_available

    if not triton_available():
        print("triton is not installed: pip install triton")
        return 2
    torch.manual_seed(0)
    report = Report(Path(args.out), args.budget_s)
    report.save("environment", environment(device))
    print(json.dumps(report.data["environment"]))
    if "attention_bench" in args.sections:
        rows = attention_bench(device, args.quick, report)
        report.save("attention_bench", rows)
        print_table("verify attention, one layer call (ms)", rows,
                    ["dtype", "N", "P", "kernel_ms", "sdpa_ms", "speedup", "note"])
    if "end_to_end" in args.sections:
        results = end_to_end(device, args, report)
        weights = "random weights" if args.random_weights else "trained weights"
        title = f"end to end, {args.model} ({weights}), greedy, {results['max_new_tokens']} new tokens"
        print_table(title, results["rows"],
                    ["dtype", "method", "tokens_per_s", "tau", "seconds", "warmup_s", "new_tokens", "note"])
        print_table("greedy parity with model.generate", results["parity"],
                    ["dtype", "method", "identical_to_hf_generate", "detail"])
    print(f"\nwrote {report.path} ({report.elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
