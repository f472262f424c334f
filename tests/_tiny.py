"""Tiny random Hugging Face causal LMs of several architectures, for parity tests (fp32, CPU)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 97
ARCHITECTURES = ("llama", "qwen2", "gpt2", "gemma3")


def tiny_causal_lm(
    arch: str, seed: int = 0, vocab: int = VOCAB, positions: int = 256, window: int | None = None, layers: int = 2
) -> torch.nn.Module:
    """A ``layers``-layer random model of ``arch`` with a ``vocab``-token vocabulary, in eval mode, whose
    generation config names no EOS (``t1`` is the tokenizer's EOS).

    Gemma-3 gets a sliding window of ``window`` (default: ``positions``, so every layer sees everything).
    """
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                  bos_token_id=0, eos_token_id=1, pad_token_id=0)
    configs = {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**common)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**common)),
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4, n_positions=positions,
            bos_token_id=0, eos_token_id=1, pad_token_id=0)),
        "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=8, sliding_window=window or positions)),
    }
    torch.manual_seed(seed)
    model = configs[arch]().eval()
    # Parity tests decode whole budgets: no EOS in the generation config (which speculative_generate, like
    # generate, reads by default); a test about EOS passes one or sets the config's.
    model.generation_config.eos_token_id = None
    return model


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer for the tiny models: ``"t5 t6"`` -> ``[5, 6]``; ``t1`` is EOS, ``t0`` padding."""
    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="t1", pad_token="t0")
