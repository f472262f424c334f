"""Grammar constraints on xgrammar: a compiled grammar (JSON schema, regex or EBNF) over a tokenizer's vocabulary,
and a matcher per generation that walks every path of a draft tree and rolls back."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import torch

from specprim._types import DraftTree


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ImportError("grammar constraints need xgrammar: pip install 'specprim[structured]'") from None
    return xgrammar


@dataclasses.dataclass(frozen=True, eq=False)
class GrammarConstraint:
    """A grammar compiled against one vocabulary; build it with :meth:`json_schema`, :meth:`regex` or
    :meth:`ebnf`. ``begin()`` starts a generation. ``source`` says which grammar (the ``repr`` is the log)."""

    source: str
    compiled: Any = dataclasses.field(repr=False)
    vocab_size: int = dataclasses.field(repr=False)

    @classmethod
    def json_schema(cls, schema: str | dict, tokenizer: Any, *, vocab_size: int | None = None,
                    stop_token_ids: Sequence[int] | None = None) -> GrammarConstraint:
        """JSON output valid under ``schema`` (a dict or JSON text), on one line (``", "`` and ``": "`` between
        items). ``tokenizer``: a Hugging Face tokenizer, or the token strings in id order. ``vocab_size``: the
        target's ``V`` (default: the tokenizer's). ``stop_token_ids``: the tokens that end the output once it is
        complete (default: the tokenizer's EOS)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ValueError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        text = json.dumps(schema)
        return cls._compile(f"json_schema({text})", tokenizer, vocab_size, stop_token_ids,
                            lambda compiler: compiler.compile_json_schema(text, any_whitespace=False))

    @classmethod
    def regex(cls, pattern: str, tokenizer: Any, *, vocab_size: int | None = None,
              stop_token_ids: Sequence[int] | None = None) -> GrammarConstraint:
        """Output matching the regular expression ``pattern`` (whole); the other arguments as for
        :meth:`json_schema`."""
        return cls._compile(f"regex({pattern!r})", tokenizer, vocab_size, stop_token_ids,
                            lambda compiler: compiler.compile_regex(pattern))

    @classmethod
    def ebnf(cls, grammar: str, tokenizer: Any, *, vocab_size: int | None = None,
             stop_token_ids: Sequence[int] | None = None) -> GrammarConstraint:
        """Output derived from the rule ``root`` of the EBNF (GBNF) ``grammar``; the other arguments as for
        :meth:`json_schema`."""
        return cls._compile(f"ebnf({grammar!r})", tokenizer, vocab_size, stop_token_ids,
                            lambda compiler: compiler.compile_grammar(grammar))

    @classmethod
    def _compile(cls, source: str, tokenizer: Any, vocab_size: int | None, stop_token_ids: Sequence[int] | None,
                 compile_with: Any) -> GrammarConstraint:
        xgr = _xgrammar()
        info = _tokenizer_info(xgr, tokenizer, vocab_size, stop_token_ids)
        try:
            compiled = compile_with(xgr.GrammarCompiler(info, max_threads=1))
        except (RuntimeError, ValueError) as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"invalid {source.partition('(')[0].replace('_', ' ')}: {first_line}") from None
        constraint = cls(source=source, compiled=compiled, vocab_size=info.vocab_size)
        if not bool(constraint.begin().allowed_after_root().any()):
            raise ValueError(f"the grammar {source} admits no output with this vocabulary")
        return constraint

    def logits_processor(self, prompt_length: int) -> Any:
        """A ``transformers`` logits processor for plain constrained decoding of one sequence whose prompt has
        ``prompt_length`` tokens (``model.generate(..., logits_processor=[...])``)."""
        from specprim.constraints._processor import ConstrainedLogits

        return ConstrainedLogits(self, prompt_length)

    def begin(self) -> GrammarState:
        """A fresh matcher at the start of the output."""
        matcher = _xgrammar().GrammarMatcher(self.compiled)
        return GrammarState(matcher=matcher, vocab_size=self.vocab_size)


def _tokenizer_info(xgr: Any, tokenizer: Any, vocab_size: int | None, stop_token_ids: Sequence[int] | None) -> Any:
    stop = None if stop_token_ids is None else [int(token) for token in stop_token_ids]
    if isinstance(tokenizer, (list, tuple)):
        if not all(isinstance(token, str) for token in tokenizer):
            raise TypeError("a vocabulary must be a list of token strings in id order")
        if stop is None:
            raise ValueError("a vocabulary given as a list of strings needs stop_token_ids")
        return xgr.TokenizerInfo(list(tokenizer), vocab_size=vocab_size or len(tokenizer), stop_token_ids=stop)
    if not hasattr(tokenizer, "get_vocab"):
        raise TypeError(f"tokenizer must be a Hugging Face tokenizer or a list of token strings, got "
                        f"{type(tokenizer).__name__}")
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size or len(tokenizer),
                                              stop_token_ids=stop)


@dataclasses.dataclass(eq=False)
class GrammarState:
    """An xgrammar matcher after the committed output (one per generation)."""

    matcher: Any
    vocab_size: int

    def allowed_after_root(self) -> torch.Tensor:
        """(V,) bool, the tokens allowed next."""
        bitmask = _xgrammar().allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        return _unpack(bitmask, self.vocab_size)[0]

    def allowed(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """See :meth:`specprim.constraints.ConstraintState.allowed`: every path is walked from the root with the
        matcher, which rolls back on the way up; the children of a node that completes the grammar are invalid."""
        bitmask = _xgrammar().allocate_token_bitmask(tree.num_nodes + 1, self.vocab_size)  # (N + 1, W) int32
        valid = torch.zeros(tree.num_nodes, dtype=torch.bool)
        tokens = tree.tokens[0].tolist()
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        stack = [(node, False) for node in reversed(tree.children[0])]  # (node, leaving)
        while stack:
            node, leaving = stack.pop()
            if leaving:
                self.matcher.rollback(1)
                continue
            if self.matcher.is_terminated() or not self.matcher.accept_token(tokens[node]):
                continue
            valid[node] = True
            if not self.matcher.is_terminated():
                self.matcher.fill_next_token_bitmask(bitmask, node + 1)
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(tree.children[node + 1]))
        masks = _unpack(bitmask, self.vocab_size)  # (N + 1, V)
        valid &= masks[1:].any(-1)  # a node after which nothing is allowed is a dead end (its children are invalid)
        if not bool(masks[0].any()):
            raise ValueError("the grammar admits no next token here (a dead end of the grammar on this vocabulary)")
        return valid, masks

    def advance(self, tokens: list[int]) -> int:
        for count, token in enumerate(tokens, start=1):
            if not self.matcher.accept_token(token):
                raise ValueError(f"token {token} is not allowed by the grammar here")
            if self.matcher.is_terminated():
                return count
        return len(tokens)

    @property
    def finished(self) -> bool:
        return bool(self.matcher.is_terminated())


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(R, W) int32 bitmask (bit ``j`` of word ``w`` is token ``32 w + j``) -> (R, V) bool."""
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1  # (R, W, 32)
    return bits.flatten(1)[:, :vocab_size].bool()
