"""The reference loop: greedy parity with model.generate on tiny models of several architectures, trees,
EOS and budget handling, streaming, and clear errors for bad input."""

import pytest
import torch
from _tiny import ARCHITECTURES, VOCAB, tiny_causal_lm
from transformers import TextStreamer

from specprim import DraftTree, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import DraftRequest, EarlyExit, ModelDrafter, PromptLookup
from specprim.hf import StaticTarget
from specprim.trees import Chain


def reference(target, prompt, max_new_tokens, eos_token_id=None):
    return target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos_token_id, pad_token_id=0,
    )


class OracleTreeDrafter:
    """Drafts a fixed 3-branch tree of random tokens in which one random branch holds a random-length prefix of
    the true greedy continuation, so accepted paths are not node prefixes and the cache must be gathered."""

    parents = [-1, -1, -1, 0, 1, 2, 3, 4, 5]  # three branches of depth 3

    def __init__(self, truth: torch.Tensor, seed: int = 0):
        self.truth = truth[0]
        self.rng = torch.Generator().manual_seed(seed)
        self.observed = 0

    def propose(self, request: DraftRequest) -> DraftTree:
        position = request.input_ids.shape[1]
        tokens = torch.randint(0, request.vocab_size, (9,), generator=self.rng)
        branch = int(torch.randint(0, 3, (1,), generator=self.rng))
        correct = int(torch.randint(0, 4, (1,), generator=self.rng))
        for depth in range(min(correct, len(self.truth) - position)):
            tokens[branch + 3 * depth] = self.truth[position + depth]
        return DraftTree(tokens=tokens[None], parents=torch.tensor(self.parents), sampling="deterministic")

    def observe(self, verdict):
        self.observed += 1


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("rule", [Greedy(), SpeculativeSampling()], ids=["greedy", "spec-sampling"])
def test_chain_parity_with_generate(arch, rule):
    target = tiny_causal_lm(arch, seed=0)
    draft = tiny_causal_lm(arch, seed=1)
    prompt = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = reference(target, prompt, 40)
    for drafter in (ModelDrafter(draft, Chain(3)), ModelDrafter(target, Chain(5))):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=rule, max_new_tokens=40)
        assert torch.equal(out.sequences, expected), arch
    assert out.stats.tau == pytest.approx(out.stats.new_tokens / out.stats.steps)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tree_parity_with_gathered_cache(arch):
    target = tiny_causal_lm(arch, seed=0)
    prompt = torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    expected = reference(target, prompt, 48)
    drafter = OracleTreeDrafter(expected)
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=48)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tau > 1.5  # the oracle branch was accepted often, through gathered cache entries
    assert drafter.observed == out.stats.steps


def test_prompt_lookup_parity_and_speedup_in_steps():
    target = tiny_causal_lm("llama", seed=0)
    pattern = torch.randint(2, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    prompt = torch.cat([pattern, pattern, pattern[:, :4]], dim=1)
    expected = reference(target, prompt, 40)
    out = speculative_generate(
        target, prompt, drafter=PromptLookup(num_tokens=6), acceptance=Greedy(), max_new_tokens=40
    )
    assert torch.equal(out.sequences, expected)


def test_prompt_lookup_finds_latest_match():
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 9, 10, 5, 6]])
    request = DraftRequest(input_ids=ids, sampling=Greedy_sampling(), vocab_size=20, max_depth=3)
    tree = PromptLookup(max_ngram=2, num_tokens=3, max_matches=1).propose(request)
    assert tree.tokens.tolist() == [[9, 10, 5]] and tree.parent_list == [-1, 0, 1]
    none = PromptLookup().propose(DraftRequest(input_ids=torch.tensor([[1, 2, 3]]), sampling=Greedy_sampling(),
                                               vocab_size=20, max_depth=3))
    assert none.num_nodes == 0


def Greedy_sampling():
    from specprim.sampling import SamplingConfig

    return SamplingConfig()


def test_eos_inside_an_accepted_block_stops_there():
    target = tiny_causal_lm("llama", seed=0)
    prompt = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(6))
    free = reference(target, prompt, 30)[0, 5:]
    eos = int(free[7])  # a token the greedy continuation emits at position 7 (maybe earlier too)
    expected = reference(target, prompt, 30, eos_token_id=eos)
    out = speculative_generate(
        target, prompt, drafter=ModelDrafter(target, Chain(6)), acceptance=Greedy(), max_new_tokens=30,
        eos_token_id=eos,
    )
    assert torch.equal(out.sequences, expected)
    assert out.sequences[0, -1] == eos and (out.sequences[0, 5:-1] != eos).all()


def test_budget_is_exact_and_zero_returns_prompt():
    target = tiny_causal_lm("qwen2", seed=0)
    prompt = torch.randint(2, VOCAB, (1, 5))
    for budget in (1, 2, 7):
        out = speculative_generate(target, prompt, drafter=ModelDrafter(target, Chain(4)),
                                   acceptance=Greedy(), max_new_tokens=budget)
        assert out.sequences.shape[1] == 5 + budget
        assert max(out.stats.tree_depth) <= budget - 1
    out = speculative_generate(target, prompt, drafter=ModelDrafter(target), acceptance=Greedy(), max_new_tokens=0)
    assert torch.equal(out.sequences, prompt) and out.stats.steps == 0


def test_one_token_prompt():
    target = tiny_causal_lm("gpt2", seed=0)
    prompt = torch.tensor([[7]])
    out = speculative_generate(target, prompt, drafter=ModelDrafter(target), acceptance=Greedy(), max_new_tokens=9)
    assert torch.equal(out.sequences, reference(target, prompt, 9))


def test_streamer_receives_every_new_token():
    class Collect(TextStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    target = tiny_causal_lm("llama", seed=0)
    prompt = torch.randint(2, VOCAB, (1, 5))
    streamer = Collect()
    out = speculative_generate(target, prompt, drafter=ModelDrafter(target), acceptance=Greedy(),
                               max_new_tokens=12, streamer=streamer)
    assert streamer.chunks[0] == prompt[0].tolist() and streamer.ended
    assert sum(streamer.chunks[1:], []) == out.sequences[0, 5:].tolist()


def test_sampling_is_reproducible_with_a_generator():
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompt = torch.randint(2, VOCAB, (1, 5))

    def run(seed):
        return speculative_generate(
            target, prompt, drafter=ModelDrafter(draft), acceptance=SpeculativeSampling(), max_new_tokens=20,
            temperature=1.0, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(seed),
        ).sequences

    assert torch.equal(run(0), run(0))
    assert not torch.equal(run(0), run(1))


class TestBadInput:
    target = tiny_causal_lm("llama", seed=0)
    prompt = torch.randint(2, VOCAB, (1, 5))

    def run(self, **overrides):
        kwargs = dict(drafter=ModelDrafter(self.target), acceptance=SpeculativeSampling(), max_new_tokens=4)
        kwargs.update(overrides)
        target = kwargs.pop("target", self.target)
        prompt = kwargs.pop("prompt", self.prompt)
        return speculative_generate(target, prompt, **kwargs)

    @pytest.mark.parametrize(
        "overrides, message",
        [
            (dict(prompt=torch.empty(1, 0, dtype=torch.long)), "prompt is empty"),
            (dict(prompt=torch.randint(0, 9, (2, 4))), "batch size 2"),
            (dict(prompt=torch.randint(0, 9, (4,))), r"\(B, T\)"),
            (dict(max_new_tokens=-1), "max_new_tokens"),
            (dict(temperature=-0.5), "temperature"),
            (dict(temperature=1.0, top_p=0.0), "top_p"),
            (dict(temperature=1.0, top_p=1.5), "top_p"),
            (dict(temperature=1.0, top_k=0), "top_k"),
            (dict(max_new_tokens=300), "context window"),
            (dict(temperature=1.0, acceptance=Greedy()), "greedy"),
        ],
    )
    def test_value_errors(self, overrides, message):
        with pytest.raises(ValueError, match=message):
            self.run(**overrides)

    def test_not_a_causal_lm(self):
        with pytest.raises(TypeError):
            self.run(target=torch.nn.Linear(2, 2))
        with pytest.raises(TypeError):
            ModelDrafter(torch.nn.Linear(2, 2))

    def test_draft_vocab_larger_than_target(self):
        big_draft = tiny_causal_lm("llama", seed=1, vocab=VOCAB + 10)
        with pytest.raises(ValueError, match="larger than the target"):
            self.run(drafter=ModelDrafter(big_draft))

    def test_draft_vocab_prefix_is_padded(self):
        small_draft = tiny_causal_lm("llama", seed=1, vocab=VOCAB - 10)
        out = self.run(drafter=ModelDrafter(small_draft), temperature=1.0, max_new_tokens=12,
                       generator=torch.Generator().manual_seed(0))
        assert out.sequences.shape[1] == 5 + 12

    def test_nan_logits(self):
        broken = tiny_causal_lm("llama", seed=2)
        with torch.no_grad():
            broken.lm_head.weight[3, 0] = float("nan")
        with pytest.raises(FloatingPointError, match="NaN"):
            self.run(target=broken)

    def test_drafter_returning_a_bad_tree(self):
        class Liar:
            def propose(self, request):
                return DraftTree(tokens=torch.tensor([[VOCAB + 3]]), parents=torch.tensor([-1]))

            def observe(self, verdict):
                pass

        with pytest.raises(ValueError, match="outside the target's vocabulary"):
            self.run(drafter=Liar())

    def test_sliding_window_beyond_the_window(self):
        gemma = tiny_causal_lm("gemma3", seed=0, window=16)
        with pytest.raises(ValueError, match="sliding attention window"):
            self.run(target=gemma, max_new_tokens=12)

    def test_invalid_tree(self):
        with pytest.raises(ValueError, match="node 1"):
            DraftTree(tokens=torch.zeros(1, 2, dtype=torch.long), parents=torch.tensor([-1, 1]))
        with pytest.raises(ValueError, match="q is required"):
            DraftTree(tokens=torch.zeros(1, 1, dtype=torch.long), parents=torch.tensor([-1]), sampling="iid")


@pytest.mark.parametrize(
    "arch, device_map",
    [
        ("llama", {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                   "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}),
        ("gpt2", {"transformer.wte": "disk", "transformer.wpe": "cpu", "transformer.h.0": "cpu",
                  "transformer.h.1": "disk", "transformer.ln_f": "cpu", "lm_head": "disk"}),
    ],
)
def test_target_dispatched_by_accelerate(arch, device_map, tmp_path):
    """A target split by accelerate's device map (here across CPU and disk offload, the same hooks that spread a
    model over several GPUs) works unchanged."""
    from accelerate import dispatch_model

    target = tiny_causal_lm(arch)
    prompt = torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(8))
    expected = reference(target, prompt, 30)
    dispatched = dispatch_model(target, device_map=device_map, offload_dir=str(tmp_path))
    for drafter in (OracleTreeDrafter(expected), EarlyExit(dispatched, 1)):
        out = speculative_generate(dispatched, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=30)
        assert torch.equal(out.sequences, expected), drafter


def test_early_exit_view_does_not_run_the_targets_hooks():
    target = tiny_causal_lm("llama", layers=3)
    calls = []
    target.register_forward_hook(lambda module, args, output: calls.append(1))
    drafter = EarlyExit(target, 1)
    speculative_generate(target, torch.tensor([[3, 4, 5]]), drafter=drafter, acceptance=Greedy(), max_new_tokens=6)
    out_steps = len(calls)
    drafter.model.model(torch.tensor([[3, 4]]))
    assert len(calls) == out_steps  # the view's own forward did not fire the target's hook


def test_eos_and_pad_come_from_the_model_generation_config_like_generate():
    from transformers import GenerationConfig

    target = tiny_causal_lm("llama", seed=3)
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])
    free = speculative_generate(target, ids, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=16,
                                eos_token_id=[])
    stop = int(free.sequences[0, ids.shape[1] + 4])  # a token the run emits: made the model's EOS below
    target.generation_config.eos_token_id = stop
    plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                            pad_token_id=stop)  # stops at the config's EOS
    out = speculative_generate(target, ids, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=16,
                               generation_config=target.generation_config)
    assert out.sequences.shape[1] < free.sequences.shape[1] and int(out.sequences[0, -1]) == stop
    assert torch.equal(out.sequences[0], plain[0, : out.sequences.shape[1]])
    by_default = speculative_generate(target, ids, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=16)
    assert torch.equal(by_default.sequences, out.sequences)  # the model's own config, as generate reads it
    static = speculative_generate(StaticTarget(target, compile=False), ids, drafter=PromptLookup(),
                                  acceptance=Greedy(), max_new_tokens=16)
    assert torch.equal(static.sequences, out.sequences)  # and that of the model a verifier wraps
    no_eos = speculative_generate(target, ids, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=16,
                                  eos_token_id=None)
    assert torch.equal(no_eos.sequences, free.sequences)  # None passed explicitly: no EOS, as in generate
    config = GenerationConfig(eos_token_id=None, do_sample=True, temperature=0.5)
    sampled = speculative_generate(target, ids, drafter=PromptLookup(), acceptance=SpeculativeSampling(),
                                   max_new_tokens=16, generation_config=config, generator=torch.Generator())
    assert sampled.sequences.shape[1] == ids.shape[1] + 16  # that config's own EOS (none), and it samples


def test_a_one_row_attention_mask_streams_like_a_call_without_it():
    target = tiny_causal_lm("llama", seed=3)
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])
    streamed = []

    class Collect(TextStreamer):
        def __init__(self):
            pass

        def put(self, value):
            streamed.append(value.reshape(-1).tolist())

        def end(self):
            streamed.append("end")

    out = speculative_generate(target, ids, torch.ones_like(ids), drafter=PromptLookup(), acceptance=Greedy(),
                               max_new_tokens=8, eos_token_id=[], streamer=Collect())
    assert streamed[0] == ids[0].tolist() and streamed[-1] == "end"
    assert sum(streamed[1:-1], []) == out.sequences[0, ids.shape[1]:].tolist()
