"""The ``specprim`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence

import torch

from specprim import models, presets
from specprim.bench import add_bench_parser
from specprim.drafters import Datastore, static_drafting
from specprim.hf import StaticTarget, check_tokenizers_compatible
from specprim.hf._static_target import QUERY_BUCKETS
from specprim.speedup._cli import add_tune_parser
from specprim.train._campaign_cli import add_campaign_parser
from specprim.train._cli import add_train_parser
from specprim.trees._spec import SPEC_HELP

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def chat_input_ids(tokenizer, prompt: str) -> torch.Tensor:
    """(1, T) ids of ``prompt`` as one user turn, rendered with the tokenizer's chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    else:
        text = prompt
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def generate_command(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    try:
        model, tokenizer = models.load(args.target, dtype=DTYPES[args.dtype], quantize=args.quantize,
                                       pack=args.pack, compile=args.compile)
        draft = None
        if args.draft:
            draft, draft_tokenizer = models.load(args.draft, dtype=DTYPES[args.dtype], quantize=args.draft_quantize,
                                                 pack=args.pack, compile=args.compile)
            check_tokenizers_compatible(tokenizer, draft_tokenizer)
    except ValueError as error:
        raise SystemExit(f"specprim generate: {error}") from error
    if args.draft_vocab is not None and not presets.drafts_with_a_draft_model(args.method):
        raise SystemExit("specprim generate: --draft-vocab applies to --method leviathan (its --draft model) only")
    if args.datastore is not None and not presets.uses_datastore(args.method):
        raise SystemExit("specprim generate: --datastore applies to methods with a datastore part only")
    try:
        datastore = None if args.datastore is None else models.load_datastore(args.datastore, tokenizer)
        method = presets.from_name(args.method, target=model, draft=draft, head=args.head, num_draft=args.num_draft,
                                   exit_layer=args.exit_layer, tree=args.tree, draft_vocab_size=args.draft_vocab,
                                   datastore=datastore, max_nodes=args.max_nodes)
    except ValueError as error:
        raise SystemExit(f"specprim generate: {error}") from error
    ids = chat_input_ids(tokenizer, args.prompt)
    try:
        verifier = StaticTarget(model) if args.static_verify else model
        if args.static_draft:
            cache_length = ids.shape[1] + args.max_new_tokens + QUERY_BUCKETS[-1]
            drafter = static_drafting(method.drafter, min_cache_length=cache_length)
            method = dataclasses.replace(method, drafter=drafter)
    except TypeError as error:
        raise SystemExit(f"specprim generate: {error}") from error
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    eos = tokenizer.eos_token_id

    def plain(max_new_tokens: int) -> torch.Tensor:
        extra = dict(do_sample=True, temperature=args.temperature, top_k=args.top_k or 0,
                     top_p=args.top_p or 1.0) if args.temperature > 0 else dict(do_sample=False)
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              eos_token_id=eos, pad_token_id=eos, **extra)

    def speculative(max_new_tokens: int):
        generator = torch.Generator().manual_seed(args.seed)
        return method.generate(verifier, ids, max_new_tokens=max_new_tokens, eos_token_id=eos,
                               generator=generator, **sampling)

    plain(8), speculative(args.max_new_tokens if args.static_verify else 8)  # warm-up: compiles every tree bucket
    baseline, plain_s = _timed(lambda: plain(args.max_new_tokens))
    out, spec_s = _timed(lambda: speculative(args.max_new_tokens))
    new_ids = out.sequences[0, ids.shape[1]:]
    plain_new = baseline.shape[1] - ids.shape[1]
    spec_rate, plain_rate = len(new_ids) / spec_s, plain_new / plain_s
    print(tokenizer.decode(new_ids, skip_special_tokens=True))
    print("---")
    stats = out.stats
    weights = (f", {args.quantize} weights" if args.quantize else "") + (", packed" if args.pack else "")
    weights += (", compiled" if args.compile else "") + (", static compiled verification" if args.static_verify else "")
    weights += ", static compiled drafting" if args.static_draft else ""
    print(f"method {args.method} | target {args.target} ({args.dtype}{weights}) | new tokens {len(new_ids)} | "
          f"steps {stats.steps} | tau {stats.tau:.2f} (mean accepted length, bonus token included)")
    line = (f"specprim {spec_rate:.1f} tok/s | plain model.generate {plain_rate:.1f} tok/s | "
            f"speedup {spec_rate / plain_rate:.2f}x")
    if args.temperature == 0:
        same = torch.equal(baseline[0], out.sequences[0])
        line += f" | identical to plain greedy: {'yes' if same else 'no'}"
    print(line)
    return 0


def datastore_command(args: argparse.Namespace) -> int:
    try:
        tokenizer = models.load_tokenizer(args.target)
        texts = [text for path in args.inputs for text in models.read_texts(path)]
        store = Datastore.from_texts(texts, tokenizer, max_ngram=args.max_ngram, min_ngram=args.min_ngram)
    except (ValueError, OSError) as error:
        raise SystemExit(f"specprim datastore: {error}") from error
    store.save(args.out)
    print(f"{store!r} from {len(args.inputs)} file(s) -> {args.out}")
    return 0


def _method_name(name: str) -> str:
    if not presets.is_name(name):
        raise argparse.ArgumentTypeError(f"unknown method {name!r}; choose from {', '.join(presets.NAMES)} or join "
                                         "several with '+'")
    return name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specprim", description="Speculative decoding primitives.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser(
        "generate", help="speculative generation; prints the text, tau and the speedup over plain decoding"
    )
    gen.add_argument("--target", default="smollm2-135m-instruct",
                     help=f"target model: one of {sorted(models.KNOWN_MODELS)}, a local path or a hub id")
    gen.add_argument("--method", type=_method_name, default="prompt-lookup",
                     help=f"one of {', '.join(presets.NAMES)}, or several joined by '+' (drafting together)")
    gen.add_argument("--draft", help="draft model for --method leviathan")
    gen.add_argument("--draft-vocab", type=int, help=presets.DRAFT_VOCAB_HELP)
    gen.add_argument("--head", help="trained head directory for --method medusa / eagle / eagle3 / mtp")
    gen.add_argument("--exit-layer", type=int, help="exit layer for --method early-exit (default: half the layers)")
    gen.add_argument("--datastore", action="append", help=presets.DATASTORE_HELP)
    gen.add_argument("--max-nodes", type=int, help=presets.MAX_NODES_HELP)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--num-draft", type=int, help="draft tokens per step (default: the preset's)")
    gen.add_argument("--tree", help=f"replace the preset's tree shape: {SPEC_HELP} (see specprim tune)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    gen.add_argument("--quantize", choices=models.QUANTIZE_SCHEMES,
                     help="weight-only quantize the target's linear layers (the plain baseline runs the same model)")
    gen.add_argument("--draft-quantize", choices=models.QUANTIZE_SCHEMES,
                     help="weight-only quantize the --draft model's linear layers")
    gen.add_argument("--pack", action="store_true",
                     help="pre-pack the bfloat16 models' linears for oneDNN on CPU (the plain baseline runs them too)")
    gen.add_argument("--compile", action="store_true",
                     help="torch.compile the models' forward (not with --pack; the first calls compile for minutes)")
    gen.add_argument("--static-draft", action="store_true",
                     help="draft through static, compiled draft models (draft LMs, EAGLE heads; compiles first)")
    gen.add_argument("--static-verify", action="store_true",
                     help="verify with a static KV cache and padded trees, torch.compiled with static shapes "
                          "(specprim.hf.StaticTarget; compiles during the warm-up)")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=generate_command)
    store = commands.add_parser(
        "datastore", help="build a retrieval datastore (for --method datastore) from text files",
        description="Tokenise text with the target's tokenizer and save it for --datastore FILE. Inputs: .jsonl "
                    'files (one string, {"text": ...} or conversation a line; assistant turns are taken) or any '
                    "other file as one text.",
    )
    store.add_argument("inputs", nargs="+", help="text files (.jsonl records, or any file as one text)")
    store.add_argument("--target", default="smollm2-135m-instruct",
                       help="the model whose tokenizer to use: a known name, a local path or a hub id")
    store.add_argument("--out", required=True, help="the .npz file to write")
    store.add_argument("--max-ngram", type=int, default=6, help="longest suffix looked up (default 6)")
    store.add_argument("--min-ngram", type=int, default=2, help="shortest suffix looked up (default 2)")
    store.set_defaults(func=datastore_command)
    add_bench_parser(commands)
    add_train_parser(commands)
    add_campaign_parser(commands)
    add_tune_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
