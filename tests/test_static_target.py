"""``StaticTarget``: static-cache, padded-tree verification. Eager and compiled, it decodes exactly what the model's
own ``generate`` decodes (fp32, branching trees whose accepted nodes must be moved in the cache, EAGLE-3 hidden
states, a cache that grows mid-generation, sampling with a fixed seed); a verifier that skips the cache move is
caught; the bench verifies through it; unsupported models and inputs raise clear errors."""

import contextlib
import os

import pytest
import torch
from _tiny import tiny_causal_lm, tiny_tokenizer
from test_eagle import PROMPT, hf_greedy, make_head, trained_eagle3
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specprim import DraftTree, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.bench import run
from specprim.drafters import PromptLookup
from specprim.drafters._eagle_draft import eagle_drafter
from specprim.hf import HFTarget, StaticTarget, _static_target, query_bucket
from specprim.hf._windowed_attention import WINDOWED_SDPA, windowed_attention, windowed_sdpa_forward
from specprim.masks import additive_mask
from specprim.models import quantize_weights
from specprim.trees import DynamicTree

BRANCHING = DynamicTree(depth=3, top_k=3, budget=9)
SHORT = PROMPT[:, :4]


@pytest.fixture(scope="module")
def trained():
    """test_eagle's tiny Llama with an EAGLE-3 head trained to get drafts accepted."""
    return trained_eagle3.__wrapped__()


def _eagle3(target, seed=0):
    """An untrained EAGLE-3 head: parity with any tree, though it rarely gets a draft accepted."""
    return eagle_drafter(make_head(target, 3, 24, seed=seed), BRANCHING)


def _decode(verifier, drafter, prompt=PROMPT, max_new_tokens=32, **kwargs):
    """Greedy decoding of the whole budget: like ``hf_greedy``, no EOS stops it."""
    kwargs.setdefault("eos_token_id", None)
    return speculative_generate(verifier, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=max_new_tokens,
                                **kwargs)


def test_query_buckets_hold_the_tree_and_stay_few():
    assert [query_bucket(n) for n in (1, 2, 3, 4, 5, 9, 16, 17, 64, 65, 130)] == [2, 2, 4, 4, 8, 16, 16, 32, 64, 128,
                                                                                    192]


def test_eager_static_verification_equals_generate_when_accepted_nodes_move(trained):
    target, head = trained
    out = _decode(StaticTarget(target, compile=False), eagle_drafter(head, BRANCHING), SHORT, 40)
    assert torch.equal(out.sequences, hf_greedy(target, SHORT, 40))
    assert out.stats.tau > 1.3  # several tokens per step ...
    assert any(rank > 0 for _, _, rank in out.stats.sibling_outcomes)  # ... and a later sibling's entries moved


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_eager_static_verification_equals_generate(arch):
    target = tiny_causal_lm(arch)
    for drafter in (_eagle3(target), PromptLookup()):
        out = _decode(StaticTarget(target, compile=False), drafter)
        assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 32))
    one_token = _decode(StaticTarget(target, compile=False), _eagle3(target), PROMPT[:, :1], 12)
    assert torch.equal(one_token.sequences, hf_greedy(target, PROMPT[:, :1], 12))


def test_hidden_states_and_logits_equal_the_dynamic_cache_verifier():
    target = tiny_causal_lm("llama")
    layers = (0, 1, 2)  # embeddings, layer 0's output, the final norm's output
    static, dynamic = StaticTarget(target, compile=False), HFTarget(target)
    for hidden_static, hidden_dynamic in zip(static.start(PROMPT, layers), dynamic.start(PROMPT, layers), strict=True):
        assert hidden_static.shape == (1, PROMPT.shape[1] - 1, 32)
        torch.testing.assert_close(hidden_static, hidden_dynamic)
    tree = DraftTree(tokens=torch.tensor([[11, 12, 13, 14, 15]]), parents=torch.tensor([-1, 0, -1, 2, 1]))
    root = PROMPT[:, -1]
    logits_static, hidden_static = static.verify(root, tree, layers)  # 6 tokens, padded to 8
    logits_dynamic, hidden_dynamic = dynamic.verify(root, tree, layers)
    assert logits_static.shape == (1, 6, 97) and logits_static.dtype == torch.float32
    torch.testing.assert_close(logits_static, logits_dynamic)
    for a, b in zip(hidden_static, hidden_dynamic, strict=True):
        torch.testing.assert_close(a, b)


def test_windowed_sdpa_equals_sdpa_over_the_whole_cache():
    """Attention over the first W slots equals SDPA over all L slots with the mask padded by masked columns."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 4, 3, 8, generator=generator)  # (B, heads, Q, D)
    key, value = torch.randn(2, 1, 2, 20, 8, generator=generator)  # (B, kv heads, L, D) each
    allowed = torch.rand(1, 1, 3, 12, generator=generator) < 0.6  # (1, 1, Q, W)
    allowed[..., 0] = True
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    windowed, _ = windowed_sdpa_forward(module, query, key, value, additive_mask(allowed[0, 0], dtype=torch.float32))
    whole = torch.zeros(1, 1, 3, 20, dtype=torch.bool)
    whole[..., :12] = allowed
    reference, _ = sdpa_attention_forward(module, query, key, value, additive_mask(whole[0, 0], dtype=torch.float32))
    assert windowed.shape == (1, 3, 4, 8)
    torch.testing.assert_close(windowed, reference)


def test_windowed_attention_switches_only_sdpa_and_nests():
    target = tiny_causal_lm("llama")
    with windowed_attention(target.config) as windowed:
        assert windowed and target.config._attn_implementation == WINDOWED_SDPA
        with windowed_attention(target.config) as inner:
            assert inner and target.config._attn_implementation == WINDOWED_SDPA
        assert target.config._attn_implementation == WINDOWED_SDPA
    assert target.config._attn_implementation == "sdpa"
    target.set_attn_implementation("eager")
    with windowed_attention(target.config) as windowed:
        assert not windowed and target.config._attn_implementation == "eager"


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_attention_reads_only_the_cache_slots_written_so_far(implementation):
    """On SDPA each forward's mask (and so its attention) ends at the last slot written; on any other attention
    implementation it spans the cache as before. Both compute what the dynamic-cache verifier computes, and the
    model's own setting is back after every call."""
    target = tiny_causal_lm("llama")
    target.set_attn_implementation(implementation)
    static, dynamic = StaticTarget(target, compile=False), HFTarget(target)
    widths = []
    forward = static._forward_layers
    static._forward_layers = lambda ids, positions, mask, layers: widths.append(mask.shape[-1]) or forward(
        ids, positions, mask, layers)
    static.start(PROMPT), dynamic.start(PROMPT)
    tree = DraftTree(tokens=torch.tensor([[11, 12, 13, 14, 15]]), parents=torch.tensor([-1, 0, -1, 2, 1]))
    logits_static, _ = static.verify(PROMPT[:, -1], tree)  # 6 tokens, padded to 8
    logits_dynamic, _ = dynamic.verify(PROMPT[:, -1], tree)
    torch.testing.assert_close(logits_static, logits_dynamic)
    past = PROMPT.shape[1] - 1
    assert widths == [past + 8 if implementation == "sdpa" else static.cache_length]
    assert static.cache_length == 512 and target.config._attn_implementation == implementation


def test_compiled_verification_attends_on_any_window_with_one_graph():
    """The window's width is dynamic in the compiled graph: verifying after a longer context compiles nothing new."""
    target, graphs = tiny_causal_lm("llama"), torch._dynamo.utils.counters["stats"]
    verifier, reference = StaticTarget(target), HFTarget(target)
    tree = DraftTree(tokens=torch.tensor([[11, 12, 13]]), parents=torch.tensor([-1, 0, 1]))
    before = graphs["unique_graphs"]
    verifier.start(PROMPT[:, :4])
    verifier.verify(PROMPT[:, 3], tree)  # a window of 3 + 4 slots
    compiled = graphs["unique_graphs"]
    verifier.start(PROMPT)
    logits, _ = verifier.verify(PROMPT[:, -1], tree)  # a window of len(PROMPT) - 1 + 4 slots
    assert compiled > before and graphs["unique_graphs"] == compiled
    reference.start(PROMPT)
    torch.testing.assert_close(logits, reference.verify(PROMPT[:, -1], tree)[0], rtol=1e-4, atol=1e-4)


def test_a_verifier_that_skips_the_cache_move_is_caught(trained):
    class NoMove(StaticTarget):
        def commit(self, path, num_accepted):
            self.past_length += 1 + int(num_accepted[0])  # keeps whatever the tree left in the accepted slots

    target, head = trained
    out = _decode(NoMove(target, compile=False), eagle_drafter(head, BRANCHING), SHORT, 40)
    assert not torch.equal(out.sequences, hf_greedy(target, SHORT, 40))


def test_the_cache_grows_mid_generation(monkeypatch, trained):
    monkeypatch.setattr(_static_target, "CACHE_ROUNDING", 16)
    target, head = trained
    verifier = StaticTarget(target, compile=False)
    out = _decode(verifier, eagle_drafter(head, BRANCHING), SHORT, 40)
    assert verifier.cache_length >= SHORT.shape[1] + 40 and verifier.cache_length % 16 == 0
    assert torch.equal(out.sequences, hf_greedy(target, SHORT, 40))
    again = _decode(verifier, eagle_drafter(head, BRANCHING), PROMPT, 40)  # reuses the grown cache
    assert torch.equal(again.sequences, hf_greedy(target, PROMPT, 40))
    reserved = StaticTarget(target, compile=False, min_cache_length=40)  # long enough from the start: never grows
    reserved.start(SHORT)
    assert reserved.cache_length == 48


def test_compile_smaller_sizes_verifies_every_smaller_padded_size_and_keeps_the_cache(trained):
    target, head = trained
    verifier = StaticTarget(target, compile=False)
    out = _decode(verifier, eagle_drafter(head, BRANCHING), SHORT, 12)
    seen = {size for size, _ in verifier._shapes}
    past, keys = verifier.past_length, verifier.cache.layers[0].keys[:, :, : verifier.past_length].clone()
    verifier.compile_smaller_sizes()
    layers = tuple(eagle_drafter(head, BRANCHING).feature_layers)
    assert {(size, layers) for size in (2, 4, 8, 16) if size <= max(seen)} <= verifier._shapes
    assert verifier.past_length == past and torch.equal(verifier.cache.layers[0].keys[:, :, :past], keys)
    assert torch.equal(_decode(verifier, eagle_drafter(head, BRANCHING), SHORT, 12).sequences, out.sequences)


def test_sampling_consumes_randomness_exactly_as_the_dynamic_cache_verifier():
    target = tiny_causal_lm("llama")
    outputs = []
    for verifier in (StaticTarget(target, compile=False), target):
        generator = torch.Generator().manual_seed(3)
        outputs.append(speculative_generate(verifier, PROMPT, drafter=_eagle3(target), acceptance=SpeculativeSampling(),
                                            max_new_tokens=24, temperature=1.0, generator=generator).sequences)
    assert torch.equal(*outputs)


def test_small_compiled_forwards_multiply_through_the_cpp_gemm_template():
    """On CPU a forward of at most ``CPP_GEMM_MAX_TOKENS`` padded tokens compiles its matrix products with inductor's
    C++ GEMM template, a larger one does not, and both compute the dynamic-cache verifier's logits."""
    target, counters = tiny_causal_lm("llama"), torch._dynamo.utils.counters
    verifier, reference = StaticTarget(target), HFTarget(target)
    small = DraftTree(tokens=torch.tensor([[11, 12, 13]]), parents=torch.tensor([-1, 0, 0]))  # 4 padded tokens
    large = DraftTree(tokens=torch.tensor([[11, 12, 13, 14, 15]]), parents=torch.tensor([-1, 0, 1, 1, 0]))  # 8
    assert query_bucket(4) <= _static_target.CPP_GEMM_MAX_TOKENS < query_bucket(6)
    with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph would skip the code generation
        for tree, templated in ((small, True), (large, False)):
            before = counters["inductor"]["cpp_templated_kernel_counter"]
            verifier.start(PROMPT)
            logits, _ = verifier.verify(PROMPT[:, -1], tree)
            assert (counters["inductor"]["cpp_templated_kernel_counter"] > before) == templated
            reference.start(PROMPT)
            torch.testing.assert_close(logits, reference.verify(PROMPT[:, -1], tree)[0], rtol=1e-4, atol=1e-4)


def test_compiled_settings_choose_the_gemm_kernels_by_forward_size():
    config = torch._inductor.config
    for device, tokens, templated in (("cpu", 2, True), ("cpu", 4, True), ("cpu", 8, False), ("cpu", None, False),
                                      ("cuda", 2, False)):
        with _static_target.compiled_settings(device, tokens):
            assert config.max_autotune == templated
            assert (config.max_autotune_gemm_backends == "CPP") == templated
    assert not config.max_autotune


def test_compiled_static_verification_equals_generate(trained):
    target, head = trained
    verifier = StaticTarget(target)  # compiled: one graph per (bucket, cache length, feature layers)
    for drafter in (eagle_drafter(head, BRANCHING), PromptLookup()):
        out = _decode(verifier, drafter, SHORT, 40)
        assert torch.equal(out.sequences, hf_greedy(target, SHORT, 40))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0


def test_bench_verifies_every_specprim_method_through_one_static_target():
    results = run(target=tiny_causal_lm("llama"), tokenizer=tiny_tokenizer(), methods=["hf-static", "prompt-lookup"],
                  prompts=["t5 t6 t7 t8 t5 t6 t7"], max_new_tokens=8, static_verify=True, argv=[])
    assert results.meta["settings"]["static_verify"] is True
    assert [s.method for s in results.results] == ["hf", "hf-static", "prompt-lookup"]
    assert all(s.identical for s in results.results)  # fp32: transformers' compiled step and ours agree with hf
    lookup = results.results[2]
    assert lookup.target_forwards == lookup.steps + 1  # counted by the method: the static loop bypasses forward


def test_verify_costs_time_the_static_forward():
    from specprim.speedup import measure_verify_costs

    verifier = StaticTarget(tiny_causal_lm("llama"), compile=False)
    sizes, seconds = measure_verify_costs(verifier, PROMPT, sizes=(0, 3), repeats=1)
    assert sizes == (0, 3) and all(t > 0 for t in seconds)
    assert verifier.past_length > PROMPT.shape[1] - 1  # it really verified through the StaticTarget


def test_cli_generate_verifies_through_a_static_target(tmp_path, capsys):
    from specprim import cli

    model_dir = tmp_path / "tiny"
    tiny_causal_lm("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    assert cli.main(["generate", "--target", str(model_dir), "--method", "prompt-lookup", "--static-verify",
                     "--prompt", "t5 t6 t7 t8 t5 t6 t7", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "verifier=compiled" in out and "identical to plain greedy: yes" in out
    model_dir_gpt2 = tmp_path / "gpt2"
    tiny_causal_lm("gpt2").save_pretrained(model_dir_gpt2)
    tiny_tokenizer().save_pretrained(model_dir_gpt2)
    assert cli.main(["generate", "--target", str(model_dir_gpt2), "--static-verify", "--prompt", "t5"]) == 1
    assert "Llama-style" in capsys.readouterr().err


def test_unsupported_models_and_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="Llama-style"):
        StaticTarget(tiny_causal_lm("gpt2"))
    gemma = StaticTarget(tiny_causal_lm("gemma3", window=8), compile=False)
    with pytest.raises(TypeError, match="full attention"):
        gemma.start(PROMPT)
    target = tiny_causal_lm("llama")
    verifier = StaticTarget(target, compile=False)
    with pytest.raises(ValueError, match="one sequence"):
        verifier.start(PROMPT.expand(2, -1))
    with pytest.raises(ValueError, match="feature layer 5"):
        verifier.start(PROMPT, (5,))
    with pytest.raises(ValueError, match="one sequence at a time"):
        speculative_generate(verifier, PROMPT.expand(2, -1), drafter=PromptLookup(), acceptance=Greedy(),
                             max_new_tokens=4)


def test_compiled_settings_attend_on_the_key_value_heads_unless_the_user_chose(monkeypatch):
    """Inside ``compiled_settings`` on CPU transformers' SDPA attention runs grouped-query attention natively (the tiny
    model has 4 query and 2 key/value heads, and the compiled parity tests above run through it); a value the user
    set is kept, and the environment is restored after."""
    monkeypatch.delenv(_static_target.FORCE_GQA, raising=False)
    with _static_target.compiled_settings():
        assert os.environ[_static_target.FORCE_GQA] == "1"
    assert _static_target.FORCE_GQA not in os.environ
    monkeypatch.setenv(_static_target.FORCE_GQA, "0")
    with _static_target.compiled_settings():
        assert os.environ[_static_target.FORCE_GQA] == "0"
    assert os.environ[_static_target.FORCE_GQA] == "0"
    monkeypatch.delenv(_static_target.FORCE_GQA)
    with _static_target.compiled_settings("cuda"):  # masked GQA could fall back to the math kernel there
        assert _static_target.FORCE_GQA not in os.environ


@pytest.mark.parametrize("chunk", [1, 3, 5, 64])
def test_a_chunked_prefill_computes_the_eager_prefill(chunk):
    """Prefilling ``chunk`` tokens per forward (the last one padded, the prompt's 9 prefix tokens split unevenly or
    not at all) leaves the cache and hidden states of one eager forward: generation equals the model's own."""
    target = tiny_causal_lm("llama")
    layers = (0, 1, 2)
    chunked, whole = StaticTarget(target, compile=False, prefill_chunk=chunk), StaticTarget(target, compile=False)
    assert (chunked.prefill_chunk, whole.prefill_chunk) == (chunk, 0)
    for a, b in zip(chunked.start(PROMPT, layers), whole.start(PROMPT, layers), strict=True):
        assert a.shape == (1, PROMPT.shape[1] - 1, 32)
        torch.testing.assert_close(a, b)
    assert chunked.past_length == whole.past_length == PROMPT.shape[1] - 1
    assert chunked._shapes == set()  # prefill shapes are not verification shapes (compile_smaller_sizes ignores them)
    tree = DraftTree(tokens=torch.tensor([[11, 12, 13]]), parents=torch.tensor([-1, 0, 0]))
    torch.testing.assert_close(chunked.verify(PROMPT[:, -1], tree)[0], whole.verify(PROMPT[:, -1], tree)[0])
    for drafter in (_eagle3(target), PromptLookup()):
        out = _decode(StaticTarget(target, compile=False, prefill_chunk=chunk), drafter)
        assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 32))


def test_compiled_int4_and_bf16_targets_prefill_in_chunks():
    int4 = quantize_weights(tiny_causal_lm("llama"), "int4")
    assert StaticTarget(int4).prefill_chunk == _static_target.PREFILL_CHUNK
    assert StaticTarget(int4, compile=False).prefill_chunk == 0
    assert StaticTarget(int4, prefill_chunk=0).prefill_chunk == 0
    assert StaticTarget(tiny_causal_lm("llama")).prefill_chunk == 0  # float32
    assert StaticTarget(tiny_causal_lm("llama").to(torch.bfloat16)).prefill_chunk == _static_target.PREFILL_CHUNK
    assert StaticTarget(tiny_causal_lm("llama").to(torch.bfloat16), compile=False).prefill_chunk == 0
    for bad in (-1, 2.5, True, "64"):
        with pytest.raises(ValueError, match="prefill_chunk"):
            StaticTarget(int4, prefill_chunk=bad)


def test_a_compiled_int4_target_decodes_what_its_own_generate_decodes():
    """fp32 int4 tiny Llama, compiled: the chunked prefill and template-or-ATen products at every size keep greedy
    parity with the quantized model's ``generate``."""
    int4 = quantize_weights(tiny_causal_lm("llama"), "int4")
    verifier = StaticTarget(int4)
    assert verifier.prefill_chunk == _static_target.PREFILL_CHUNK
    out = _decode(verifier, PromptLookup(), PROMPT, 16)
    assert torch.equal(out.sequences, hf_greedy(int4, PROMPT, 16))


def test_the_gemm_template_can_be_chosen_at_every_size_or_never():
    """bf16 int4 targets take the template at every size, int4 in other dtypes never (it has no kernel for them)."""
    config = torch._inductor.config
    for tokens in (2, 8, 64):
        for choice in (True, False):
            with _static_target.compiled_settings("cpu", tokens, gemm_template=choice):
                assert config.max_autotune == choice and (config.max_autotune_gemm_backends == "CPP") == choice
    with _static_target.compiled_settings("cuda", 8, gemm_template=True):
        assert not config.max_autotune
    int4 = quantize_weights(tiny_causal_lm("llama"), "int4")
    assert StaticTarget(int4)._gemm_template is False  # float32
    assert StaticTarget(int4.to(torch.bfloat16))._gemm_template is True
    assert StaticTarget(tiny_causal_lm("llama"))._gemm_template is None


def test_warm_shapes_skip_the_guards_from_a_shape_s_second_run_on():
    warm = _static_target.WarmShapes()

    def skipping():
        return torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe

    assert [warm.call(key, skipping) for key in ("a", "a", "b", "a")] == [False, True, False, True]

    def failing():
        raise ValueError("the first run failed")

    with pytest.raises(ValueError):
        warm.call("c", failing)
    assert not warm.call("c", skipping)  # still cold: checked in full again
    calls = []

    def needs_a_new_graph():  # what a compiled function raises when a warm call would have to recompile
        calls.append(skipping())
        if skipping():
            raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance.")
        return "ran"

    assert warm.call("a", needs_a_new_graph) == "ran" and calls == [True, False]  # run again with every guard
    with pytest.raises(RuntimeError, match="another error"):
        warm.call("a", lambda: (_ for _ in ()).throw(RuntimeError("another error")))


def test_warm_shapes_enter_the_settings_only_for_calls_that_check_every_guard():
    warm, entered = _static_target.WarmShapes(), []

    @contextlib.contextmanager
    def settings():
        entered.append(True)
        yield

    def skipping():
        return torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe

    assert [warm.call(key, skipping, settings=settings) for key in ("a", "a", "b", "a")] == [False, True, False, True]
    assert len(entered) == 2  # the first call of "a" and of "b"

    def needs_a_new_graph():
        if skipping():
            raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance.")
        return "ran"

    assert warm.call("a", needs_a_new_graph, settings=settings) == "ran" and len(entered) == 3  # the retry


def test_compiled_verification_with_skipped_guards_picks_the_right_graph(monkeypatch):
    """Once warm, each shape runs with only the guards that told the graphs apart: alternating two padded sizes and
    two feature-layer sets, and then a cache that grows (a new graph), every call still computes the reference."""
    monkeypatch.setattr(_static_target, "CACHE_ROUNDING", 16)
    target = tiny_causal_lm("llama")
    verifier, reference = StaticTarget(target), HFTarget(target)
    small = DraftTree(tokens=torch.tensor([[11, 12, 13]]), parents=torch.tensor([-1, 0, 0]))  # 4 padded tokens
    large = DraftTree(tokens=torch.tensor([[11, 12, 13, 14, 15]]), parents=torch.tensor([-1, 0, 1, 1, 0]))  # 8
    for prompt in (PROMPT[:, :4], PROMPT, torch.cat([PROMPT, PROMPT, PROMPT], dim=1)):  # the last grows the cache
        for tree, layers in ((small, ()), (large, ()), (small, (1,)), (small, ()), (large, ()), (small, (1,))):
            verifier.start(prompt, layers)
            reference.start(prompt, layers)
            logits, hidden = verifier.verify(prompt[:, -1], tree, layers)
            expected_logits, expected_hidden = reference.verify(prompt[:, -1], tree, layers)
            torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
            for a, b in zip(hidden, expected_hidden, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert verifier.cache_length == 32
