import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specprim.masks import (
    additive_mask,
    from_edges,
    topological_order,
    tree_attention_mask,
    tree_extension_mask,
    tree_position_ids,
    tree_verification_mask,
)


@st.composite
def parent_lists(draw, max_nodes=12):
    size = draw(st.integers(0, max_nodes))
    return [draw(st.integers(-1, i - 1)) for i in range(size)]


def ancestors(parents, i):
    out = set()
    while parents[i] != -1:
        i = parents[i]
        out.add(i)
    return out


@given(parent_lists())
def test_mask_is_ancestor_or_self(parents):
    before = list(parents)
    mask = tree_attention_mask(parents)
    assert mask.shape == (len(parents), len(parents)) and mask.dtype == torch.bool
    for i in range(len(parents)):
        expected = ancestors(parents, i) | {i}
        assert set(mask[i].nonzero().flatten().tolist()) == expected
    assert parents == before


@given(parent_lists())
def test_tensor_and_list_inputs_agree_and_tensor_is_not_mutated(parents):
    tensor = torch.tensor(parents, dtype=torch.long)
    copy = tensor.clone()
    assert torch.equal(tree_attention_mask(tensor), tree_attention_mask(parents))
    assert torch.equal(tree_position_ids(tensor, 5), tree_position_ids(parents, 5))
    assert torch.equal(tensor, copy)


@given(parent_lists(), st.integers(0, 50))
def test_position_ids_are_depths(parents, offset):
    positions = tree_position_ids(parents, offset).tolist()
    for i in range(len(parents)):
        assert positions[i] == offset + 1 + len(ancestors(parents, i))


def test_chain():
    mask = tree_attention_mask([-1, 0, 1, 2])
    assert torch.equal(mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert tree_position_ids([-1, 0, 1, 2], offset=10).tolist() == [11, 12, 13, 14]


@pytest.mark.parametrize("parents, node", [([0], 0), ([-1, 1], 1), ([-1, 3, 0], 1), ([-2], 0)])
def test_invalid_parents_name_the_node(parents, node):
    with pytest.raises(ValueError, match=f"node {node}"):
        tree_attention_mask(parents)
    with pytest.raises(ValueError, match=f"node {node}"):
        tree_position_ids(torch.tensor(parents))


def test_from_edges_any_order():
    assert from_edges([(1, 3), (-1, 0), (0, 2), (0, 1)]) == [-1, 0, 0, 1]
    assert from_edges([]) == []


@pytest.mark.parametrize(
    "edges, message",
    [
        ([(-1, 0), (-1, 1), (0, 1)], "node 1: has two parents"),
        ([(-1, 0), (2, 1), (1, 2)], "node 1"),  # cycle 1 -> 2 -> 1
        ([(-1, 0), (0, 2)], "node 1: missing"),
        ([(-1, 0), (0, 0)], "node 0"),
        ([(-1, 0), (5, 1)], "node 1: parent 5 is not a node"),
        ([(-1, 1), (1, 0)], "node 0: its parent 1"),
    ],
)
def test_from_edges_rejects(edges, message):
    with pytest.raises(ValueError, match=message):
        from_edges(edges)


def test_topological_order_renumbers():
    parents, old_ids = topological_order([(-1, 1), (1, 0), (1, 2)])
    assert parents == [-1, 0, 0] and old_ids == [1, 0, 2]


@given(parent_lists(), st.integers(0, 6))
def test_verification_mask(parents, past):
    mask = tree_verification_mask(parents, past, batch_size=2)
    n = len(parents)
    assert mask.shape == (2, 1, 1 + n, past + 1 + n)
    allowed = mask[0, 0] == 0
    assert allowed[:, : past + 1].all()  # everyone sees prefix and root
    assert not allowed[0, past + 1 :].any()  # the root sees no draft node
    assert torch.equal(allowed[1:, past + 1 :], tree_attention_mask(parents))
    blocked = mask[0, 0][~allowed]
    assert (blocked == torch.finfo(torch.float32).min).all()


@given(parent_lists(max_nodes=8), st.integers(0, 5), st.integers(0, 4))
def test_extension_mask_rows_of_the_newest_nodes(parents, context, new):
    new = min(new, len(parents))
    allowed = tree_extension_mask(parents, new, context)
    assert allowed.shape == (new, context + len(parents))
    assert allowed[:, :context].all()
    assert torch.equal(allowed[:, context:], tree_attention_mask(parents)[len(parents) - new :])


def test_additive_mask_values_and_shape():
    allowed = torch.tensor([[True, False], [True, True]])
    mask = additive_mask(allowed, batch_size=3, dtype=torch.bfloat16)
    assert mask.shape == (3, 1, 2, 2) and mask.dtype == torch.bfloat16
    assert mask[0, 0, 0, 0] == 0 and mask[0, 0, 0, 1] == torch.finfo(torch.bfloat16).min
