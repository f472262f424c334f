"""The ``specprim`` command line.

Building the parser imports neither torch nor transformers, and each command checks its options before it imports
them: a usage error, a model name that no loader can find included, exits at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from specprim import models, recipes
from specprim._lazy import lazy_imports
from specprim._names import AUTO, METHODS, is_name
from specprim._tune_cli import add_tune_parser
from specprim._usage import UsageError, as_usage_error, check_decoding, check_file, check_json_schema
from specprim.bench import add_bench_parser
from specprim.models import check_model
from specprim.train import add_campaign_parser, add_train_parser

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py), after the command's checks
    import torch

    from specprim.hf import chat_input_ids  # noqa: F401 - still importable from here


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _recipe(args: argparse.Namespace) -> tuple[recipes.Recipe, recipes.Choice | None]:
    """The recipe ``generate`` runs: ``--recipe`` or ``auto``'s choice (``--method auto``) or the defaults, with the
    options the user typed on top; and ``auto``'s choice when it made one. Options the recipe refuses raise
    ``UsageError``; ``auto`` loads nothing for a target with a shipped recipe (any other target it measures once
    per machine)."""
    choice = None
    if hasattr(args, "recipe"):
        with as_usage_error():
            base = recipes.load_recipe(args.recipe)
    elif args.method == AUTO:
        choice = recipes.auto(args.target, temperature=args.temperature, dtype=getattr(args, "dtype", None))
        base = choice.recipe
    else:
        base = recipes.Recipe()
    with as_usage_error():
        recipe = recipes.recipe_from_args(args, base, method=None if args.method == AUTO else args.method)
    recipes.check_recipe_sources(recipe.changes())
    return recipe, choice


def _check_generate(args: argparse.Namespace) -> None:
    """The options of ``generate`` that can be checked before anything loads (``UsageError``)."""
    check_decoding(args)
    check_model("--target", args.target)
    recipes.check_recipe_sources(recipes.given_fields(args))
    check_json_schema(args.json_schema)
    if args.json_schema is not None and args.regex is not None:
        raise UsageError("--json-schema and --regex exclude each other: pass one grammar")


def _constraint(args: argparse.Namespace, tokenizer: object, model: torch.nn.Module) -> object | None:
    """The grammar of ``--json-schema`` or ``--regex`` on the target's vocabulary, or ``None``."""
    if args.json_schema is None and args.regex is None:
        return None
    from specprim.constraints import GrammarConstraint

    vocab_size = model.get_output_embeddings().weight.shape[0]
    if args.json_schema is not None:
        return GrammarConstraint.json_schema(args.json_schema.read_text(encoding="utf-8"), tokenizer,
                                             vocab_size=vocab_size)
    return GrammarConstraint.regex(args.regex, tokenizer, vocab_size=vocab_size)


def generate_command(args: argparse.Namespace) -> int:
    _check_generate(args)
    import torch

    from specprim.hf import QUERY_BUCKETS, chat_input_ids

    torch.manual_seed(args.seed)
    recipe, choice = _recipe(args)
    model, tokenizer = recipes.load_target(recipe, args.target)
    draft = recipes.load_draft(recipe, tokenizer)
    if choice is not None:  # once the models loaded: a model that fails to load says so once, in the error line
        print(f"auto: {choice.reason}\nrecipe: {recipe}", file=sys.stderr)
    ids = chat_input_ids(tokenizer, args.prompt)
    start = time.perf_counter()
    built = recipe.build(model, tokenizer, draft=draft,
                         cache_length=ids.shape[1] + args.max_new_tokens + QUERY_BUCKETS[-1],
                         prefill_chunk=0)  # one prompt: an eager prefill costs less than compiling one
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    eos = tokenizer.eos_token_id
    constraint = _constraint(args, tokenizer, model)

    def plain(max_new_tokens: int) -> torch.Tensor:
        processors = None if constraint is None else [constraint.logits_processor(ids.shape[1])]
        return recipes.plain_generate(model, ids, max_new_tokens, eos_token_id=eos, logits_processor=processors,
                                      **sampling)

    def speculative(max_new_tokens: int):
        generator = torch.Generator().manual_seed(args.seed)
        return built.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=eos, generator=generator,
                              constraint=constraint, **sampling)

    static = recipe.verifier != "eager" or recipe.static_draft
    speculative(args.max_new_tokens if static else recipe.warmup_tokens)  # compiles every shape the run meets
    warm_s = time.perf_counter() - start
    plain(8)
    baseline, plain_s = _timed(lambda: plain(args.max_new_tokens))
    out, spec_s = _timed(lambda: speculative(args.max_new_tokens))
    new_ids = out.sequences[0, ids.shape[1]:]
    plain_new = baseline.shape[1] - ids.shape[1]
    spec_rate, plain_rate = len(new_ids) / spec_s, plain_new / plain_s
    print(tokenizer.decode(new_ids, skip_special_tokens=True))
    print("---")
    stats = out.stats
    print(f"recipe {recipe} | target {args.target} | new tokens {len(new_ids)} | steps {stats.steps} | "
          f"tau {stats.tau:.2f} (mean accepted length, bonus token included)")
    line = (f"specprim {spec_rate:.1f} tok/s | plain model.generate ({recipe.dtype}) {plain_rate:.1f} tok/s | "
            f"speedup {spec_rate / plain_rate:.2f}x")
    if choice is not None and choice.expected_speedup is not None:
        line += f" (tuned: {choice.expected_speedup:.2f}x {choice.basis})"
    if args.temperature == 0:
        same = torch.equal(baseline[0], out.sequences[0])
        line += f" | identical to plain greedy: {'yes' if same else 'no'}"
    print(line)
    print(f"start-up {warm_s:.1f} s before timing (building the drafters and warming up; compiled forwards: "
          f"{'yes' if static else 'no'}); "
          f"numerics: {recipe.numerics or 'float32, as loaded'}")
    return 0


def datastore_command(args: argparse.Namespace) -> int:
    for path in args.inputs:
        check_file("input", path)
    if not 1 <= args.min_ngram <= args.max_ngram:
        raise UsageError(f"need 1 <= --min-ngram <= --max-ngram, got {args.min_ngram} and {args.max_ngram}")
    if not Path(args.out).resolve().parent.is_dir():
        raise UsageError(f"--out {args.out}: the directory {Path(args.out).resolve().parent} does not exist")
    check_model("--target", args.target)
    from specprim.drafters import Datastore

    texts = [text for path in args.inputs for text in models.read_texts(path)]
    tokenizer = models.load_tokenizer(args.target)
    store = Datastore.from_texts(texts, tokenizer, max_ngram=args.max_ngram, min_ngram=args.min_ngram)
    store.save(args.out)
    print(f"{store!r} from {len(args.inputs)} file(s) -> {args.out}")
    return 0


def _method_name(name: str) -> str:
    if name != AUTO and not is_name(name):
        raise argparse.ArgumentTypeError(f"unknown method {name!r}; choose from {', '.join(METHODS)} or join "
                                         "several with '+'")
    return name


def _generate_epilog() -> str:
    return (f"shipped heads: {', '.join(models.known_heads()) or 'none'}. shipped recipes: "
            f"{', '.join(recipes.shipped_recipes()) or 'none'}. See docs/recipes.md.")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose ``epilog`` may be a function, called only to show the help (it may import what
    it lists)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specprim", description="Speculative decoding primitives.")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (accepted anywhere on the command line)")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser(
        "generate", help="speculative generation; prints the text, tau and the speedup over plain decoding",
        epilog=_generate_epilog,
    )
    gen.add_argument("--target", default="smollm2-135m-instruct",
                     help=f"target model: one of {sorted(models.KNOWN_MODELS)}, a local path or a hub id")
    gen.add_argument("--method", type=_method_name, default=AUTO,
                     help=f"auto (default: the recipe tuned for the target, else prompt lookup), one of "
                          f"{', '.join(METHODS)}, or several joined by '+' (drafting together)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--json-schema", type=Path,
                     help="constrain the output to JSON valid under this schema file (needs specprim[structured])")
    gen.add_argument("--regex", help="constrain the output to match this regular expression (needs "
                                     "specprim[structured])")
    recipes.add_recipe_arguments(gen)
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
    _errors_in_one_line(parser)
    return parser


def _errors_in_one_line(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` and its sub-commands' parsers print their own usage errors (an unknown option, a bad choice,
    a missing argument) as one ``PROG: error: ...`` line instead of the usage block, and exit with status 2."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message} (--help lists the options)\n")

    parser.error = error  # type: ignore[method-assign]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_parser in action.choices.values():
                _errors_in_one_line(sub_parser)


def _show_progress() -> None:
    """Progress messages of the library (model downloads, datastore builds, compiling) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("specprim: %(message)s"))
    logger = logging.getLogger("specprim")
    if not logger.handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; return its exit status. 0: done. 2: a usage error (an option out of range, a file or a model
    that is not there, options that contradict each other), found before anything loads and printed as one line,
    ``specprim COMMAND: error: ...``. 1: a failure after that, printed as one line too. 130: an interrupt.
    ``--debug`` anywhere on the line lets the traceback of an error through instead."""
    words = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in words
    try:
        args = build_parser().parse_args([word for word in words if word != "--debug"])
    except SystemExit as done:  # --help (0), or a usage error argparse printed (2)
        return done.code if isinstance(done.code, int) else 2
    _show_progress()
    command = " ".join(filter(None, (args.command, getattr(args, "campaign_command", None))))
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"specprim {command}: interrupted", file=sys.stderr)
        return 130
    except UsageError as error:
        if debug:
            raise
        print(f"specprim {command}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except Exception as error:
        if debug:
            raise
        print(f"specprim {command}: error: {_one_line(error)} (--debug shows the traceback)", file=sys.stderr)
        return 1


def _one_line(error: Exception) -> str:
    """The first line of ``error``'s message, prefixed by its type unless that is a plain value, runtime or OS
    error (whose messages say what went wrong by themselves)."""
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    if isinstance(error, (ValueError, RuntimeError, OSError)) and message:
        return message
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


__getattr__, __dir__ = lazy_imports(__name__)

if __name__ == "__main__":
    sys.exit(main())
