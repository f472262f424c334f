"""specprim.hf.reserved_cache: batched, left-padded ``generate`` gives the tokens of the default cache, greedy and
sampled, with room to spare and when the room is outgrown; selected rows keep their filled part; models with other
kinds of layers keep their own cache; bad capacities are refused."""

import pytest
import torch
from _tiny import ARCHITECTURES, tiny_causal_lm

from specprim.hf import cache_kwarg, reserved_cache, reserved_cache_fits
from specprim.hf._reserved_cache import ReservedLayer


def _generate(model, cache, sample):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (3, 9), generator=generator)  # (B, T)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding of different widths
    mask[1, :2] = 0
    torch.manual_seed(7)
    extra = {} if cache is None else {cache_kwarg(model): cache}
    settings = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0, **settings,
                             **extra, output_logits=True, return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits)  # (B, T + 12), (12, B, V)


@pytest.mark.parametrize("arch", [a for a in ARCHITECTURES if a != "gemma3"])
@pytest.mark.parametrize("sample", [False, True])
def test_generate_with_reserved_room_equals_the_default_cache(arch, sample):
    model = tiny_causal_lm(arch)
    tokens, logits = _generate(model, None, sample)
    for capacity in (9 + 12, 64, 5):  # exact, spare, outgrown twice
        got_tokens, got_logits = _generate(model, reserved_cache(capacity), sample)
        assert torch.equal(got_tokens, tokens), capacity
        torch.testing.assert_close(got_logits, logits, rtol=1e-5, atol=1e-5)


def test_layer_writes_in_place_and_doubles_when_outgrown():
    layer = ReservedLayer(4)
    keys = torch.arange(2 * 3 * 3 * 2, dtype=torch.float32).reshape(2, 3, 3, 2)  # (B, H, n, D)
    first, _ = layer.update(keys, -keys)
    buffer = layer._keys
    assert torch.equal(first, keys) and buffer.shape[-2] == 4
    second, values = layer.update(keys[:, :, :1], -keys[:, :, :1])
    assert layer._keys is buffer and torch.equal(second, torch.cat([keys, keys[:, :, :1]], dim=-2))
    third, values = layer.update(keys, -keys)  # 7 positions: the room doubles to 8
    assert layer._keys.shape[-2] == 8 and layer.get_seq_length() == 7 and layer.get_mask_sizes(1) == (8, 0)
    assert torch.equal(third, torch.cat([keys, keys[:, :, :1], keys], dim=-2)) and torch.equal(values, -third)
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized


def test_it_stands_in_only_for_plain_full_attention_layers():
    assert {arch: reserved_cache_fits(tiny_causal_lm(arch)) for arch in ARCHITECTURES} == {
        "llama": True, "qwen2": True, "gpt2": True, "gemma3": False}  # gemma3: sliding-window layers


def test_bad_capacity_is_refused():
    for capacity in (0, -3):
        with pytest.raises(ValueError, match="capacity must be >= 1"):
            reserved_cache(capacity)


def test_selecting_rows_keeps_their_filled_part():
    layer = ReservedLayer(6)
    keys = torch.arange(3 * 2 * 4 * 2, dtype=torch.float32).reshape(3, 2, 4, 2)  # (B, H, n, D)
    layer.update(keys, -keys)
    layer.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(layer.keys, keys[[2, 0]]) and torch.equal(layer.values, -keys[[2, 0]])
    more, _ = layer.update(keys[:2, :, :1], -keys[:2, :, :1])  # the kept rows go on filling their room
    assert layer._keys.shape == (2, 2, 6, 2) and torch.equal(more, torch.cat([keys[[2, 0]], keys[:2, :, :1]], dim=-2))
