"""Tree builders (Chain, StaticTree, DynamicTree) against the toy TableDraftModel: shape properties, the
q-contract, equivalences between builders, EAGLE-2 selection by brute force, and validation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specprim import DraftTree
from specprim.drafters import DraftRequest
from specprim.sampling import SamplingConfig
from specprim.testing import TableDraftModel
from specprim.trees import Chain, DynamicTree, StaticTree, TreeBuilder, TreeDraftModel

GREEDY = SamplingConfig()
FAST = settings(max_examples=60, deadline=None)

# ---------------------------------------------------------------------------------------------------------
# helpers


def request(ids, vocab, max_depth, sampling=GREEDY, seed=0) -> DraftRequest:
    ids = torch.tensor(ids, dtype=torch.long)
    return DraftRequest(
        input_ids=ids if ids.dim() == 2 else ids[None], sampling=sampling, vocab_size=vocab,
        max_depth=max_depth, generator=torch.Generator().manual_seed(seed),
    )


def node_paths(tree: DraftTree, row: int = 0) -> list[tuple[int, ...]]:
    """The token path from the root to every node of ``tree`` (batch row ``row``)."""
    paths: list[tuple[int, ...]] = []
    for i, parent in enumerate(tree.parent_list):
        paths.append((() if parent == -1 else paths[parent]) + (int(tree.tokens[row, i]),))
    return paths


def check_tree(tree: DraftTree, req: DraftRequest, model: TableDraftModel) -> None:
    """Properties every builder guarantees."""
    batch = req.input_ids.shape[0]
    assert tree.batch_size == batch
    assert tree.parents.dtype == torch.long and tree.tokens.dtype == torch.long
    assert all(parent < i for i, parent in enumerate(tree.parent_list))  # topological
    assert tree.depth <= req.max_depth
    if tree.num_nodes:
        assert 0 <= int(tree.tokens.min()) and int(tree.tokens.max()) < req.vocab_size
    for row in range(batch):
        pairs = [(parent, int(tree.tokens[row, i])) for i, parent in enumerate(tree.parent_list)]
        assert len(set(pairs)) == len(pairs), "duplicate (parent, token) pair"
        # Only extended nodes can have children: every internal node's path is a scratch path of the model.
        paths = node_paths(tree, row)
        internal = {paths[parent] for parent in tree.parent_list if parent >= 0}
        if internal:
            assert internal <= set(model.scratch_paths[row])
    if tree.q is not None:
        assert tree.q.shape == (batch, tree.num_nodes + 1, req.vocab_size)
        internal_rows = [0] + [p + 1 for p in set(tree.parent_list) if p >= 0]
        sums = tree.q[:, internal_rows].sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    else:
        assert tree.sampling == "deterministic"


def values_of(model: TableDraftModel, ids: list[int], path: tuple[int, ...], sampling: SamplingConfig) -> float:
    """Cumulative draft log-probability of ``path`` after ``ids`` (DynamicTree's value)."""
    total = 0.0
    for depth, token in enumerate(path):
        logits = model.logits_for(ids + list(path[:depth]))
        logp = logits.log_softmax(-1) if sampling.is_greedy else sampling.probs(logits).log()
        total += float(logp[token])
    return total


samplings = st.one_of(
    st.just(GREEDY),
    st.builds(
        SamplingConfig,
        temperature=st.floats(min_value=0.3, max_value=2.0),
        top_k=st.none() | st.integers(min_value=1, max_value=6),
        top_p=st.none() | st.floats(min_value=0.2, max_value=1.0),
    ),
)


@st.composite
def setups(draw, max_batch: int = 1):
    """(model, request): a small vocabulary, a short context, any max_depth, greedy or sampling."""
    vocab = draw(st.integers(min_value=2, max_value=12))
    draft_vocab = draw(st.none() | st.integers(min_value=1, max_value=vocab))
    model = TableDraftModel(vocab, seed=draw(st.integers(0, 2**16)), draft_vocab_size=draft_vocab)
    batch = draw(st.integers(min_value=1, max_value=max_batch))
    length = draw(st.integers(min_value=1, max_value=5))
    ids = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length),
                        min_size=batch, max_size=batch))
    req = request(ids, vocab, draw(st.integers(min_value=0, max_value=6)), draw(samplings), draw(st.integers(0, 99)))
    return model, req


# ---------------------------------------------------------------------------------------------------------
# protocols and the empty tree


@pytest.mark.parametrize("builder", [Chain(3), StaticTree.chain(3), DynamicTree(depth=3, top_k=2, budget=5)])
def test_builders_and_model_implement_the_protocols(builder):
    assert isinstance(builder, TreeBuilder)
    assert isinstance(TableDraftModel(5), TreeDraftModel)


@pytest.mark.parametrize(
    "builder", [Chain(3), StaticTree.from_branching((2, 2)), DynamicTree(depth=3, top_k=2, budget=5)]
)
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0)])
def test_max_depth_zero_is_empty_without_calling_the_model(builder, sampling):
    model = TableDraftModel(7)
    tree = builder.build(model, request([1, 2, 3], 7, 0, sampling))
    assert tree.tokens.shape == (1, 0) and tree.parents.shape == (0,) and tree.sampling == "deterministic"
    assert model.begin_calls == 0


# ---------------------------------------------------------------------------------------------------------
# Chain


@FAST
@given(setup=setups(max_batch=3), k=st.integers(min_value=1, max_value=6))
def test_chain_properties_and_q_contract(setup, k):
    model, req = setup
    tree = Chain(k).build(model, req)
    check_tree(tree, req, model)
    depth = min(k, req.max_depth)
    assert tree.num_nodes == depth and tree.parent_list == list(range(-1, depth - 1))
    if depth:
        assert model.begin_calls == 1 and model.extend_sizes == [1] * (depth - 1)
    for row, ids in enumerate(req.input_ids.tolist()):
        path = node_paths(tree, row)[-1] if depth else ()
        for i in range(depth):
            logits = model.logits_for(ids + list(path[:i]))
            if req.sampling.is_greedy:
                assert path[i] == int(logits.argmax())
            else:  # q row i is exactly the distribution token i was drawn from
                assert torch.equal(tree.q[row, i], req.sampling.probs(logits))
                assert tree.q[row, i, path[i]] > 0
    if req.sampling.is_greedy:
        assert tree.q is None and tree.sampling == "deterministic"
    elif depth:
        assert tree.sampling == "iid" and not tree.q[:, depth].any()  # the leaf's row is zeros


def test_chain_q_contract_is_empirically_right():
    """20k proposals (one batched build: rows are independent draws) with one context: the first token follows
    q row 0 and the second token, given the first, follows that node's q row (chi-square)."""
    vocab, trials = 4, 20_000
    model = TableDraftModel(vocab, seed=3, logit_scale=1.0)
    sampling = SamplingConfig(temperature=0.9, top_p=0.95)
    req = request([[2, 0, 1]] * trials, vocab, 5, sampling, seed=11)
    tree = Chain(2).build(model, req)
    q0 = tree.q[:, 0]  # (trials, V), identical rows
    assert torch.equal(q0, q0[:1].expand_as(q0))
    first, second = tree.tokens[:, 0], tree.tokens[:, 1]
    assert _chi_square_p(first, q0[0]) > 1e-3
    for token in range(vocab):
        rows = first == token
        if int(rows.sum()) < 500:
            continue
        q1 = tree.q[rows, 1]
        assert torch.equal(q1, q1[:1].expand_as(q1))  # the row of the node that was drawn
        assert _chi_square_p(second[rows], q1[0]) > 1e-3


def test_chain_q_contract_detects_a_wrong_q():
    """The same check rejects frequencies compared with a distribution they were not drawn from."""
    vocab = 4
    model = TableDraftModel(vocab, seed=3, logit_scale=1.0)
    req = request([[2, 0, 1]] * 20_000, vocab, 5, SamplingConfig(temperature=1.0), seed=12)
    tree = Chain(1).build(model, req)
    wrong = SamplingConfig(temperature=2.0).probs(model.logits_for([2, 0, 1]))
    assert _chi_square_p(tree.tokens[:, 0], wrong) < 1e-6


def test_static_tree_without_replacement_q_contract():
    """20k batched proposals of three siblings drawn without replacement: the first follows q row 0, the second
    given the first follows q with the first removed and renormalised; the tree declares its scheme and q."""
    vocab, trials = 5, 20_000
    model = TableDraftModel(vocab, seed=4, logit_scale=1.0)
    tree_shape = StaticTree(paths=((0,), (1,), (2,), (0, 0)), sample_without_replacement=True)
    tree = tree_shape.build(model, request([[1, 2]] * trials, vocab, 2, SamplingConfig(temperature=1.0), seed=5))
    assert tree.sampling == "without_replacement"
    q0 = tree.q[0, 0]
    siblings = tree.tokens[:, :3]  # (trials, 3)
    assert (siblings[:, 0] != siblings[:, 1]).all() and (siblings[:, 1] != siblings[:, 2]).all()
    assert _chi_square_p(siblings[:, 0], q0) > 1e-3
    for token in range(vocab):
        rows = siblings[:, 0] == token
        if int(rows.sum()) < 500:
            continue
        remaining = q0.clone()
        remaining[token] = 0
        assert _chi_square_p(siblings[rows, 1], remaining / remaining.sum()) > 1e-3
    assert tree.q[:, 4].abs().sum() == 0  # leaf rows are zero
    greedy = tree_shape.build(model, request([[1, 2]], vocab, 2, SamplingConfig(), seed=5))
    assert greedy.sampling == "deterministic" and greedy.q is None


def _chi_square_p(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.shape[0]).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token of probability zero"
    expected = probs[support].double() / probs[support].double().sum() * counts.sum()
    return float(stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


# ---------------------------------------------------------------------------------------------------------
# StaticTree


@st.composite
def prefix_closed_paths(draw):
    """Random prefix-closed rank paths (a random tree with random sibling ranks)."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=10))):
        parent = draw(st.sampled_from([(), *paths]))
        free = sorted(set(range(4)) - {p[-1] for p in paths if p[:-1] == parent})
        if free:
            paths.append(parent + (draw(st.sampled_from(free)),))
    return tuple(paths)


@FAST
@given(setup=setups(max_batch=2), paths=prefix_closed_paths())
def test_static_tree_properties_and_ranks(setup, paths):
    model, req = setup
    builder = StaticTree(paths=paths)
    kept = [p for p in builder.paths if len(p) <= req.max_depth]
    if kept and 1 + max(max(p) for p in kept) > req.vocab_size:
        with pytest.raises(ValueError, match="rank"):
            builder.build(model, req)
        return
    tree = builder.build(model, req)
    check_tree(tree, req, model)
    assert tree.num_nodes == len(kept) and tree.sampling == "deterministic" and tree.q is None
    index = {p: i for i, p in enumerate(kept)}
    assert tree.parent_list == [index.get(p[:-1], -1) for p in kept]
    # Rank r is the r-th best token of the parent's distribution (compared by score, robust to ties).
    for row, ids in enumerate(req.input_ids.tolist()):
        tokens = node_paths(tree, row)
        for i, rank_path in enumerate(kept):
            logits = model.logits_for(ids + list(tokens[i][:-1]))
            scores = logits if req.sampling.is_greedy else req.sampling.probs(logits)
            assert scores[tokens[i][-1]] == scores.sort(descending=True).values[rank_path[-1]]
    # One batched extend per depth, of exactly the nodes that have children.
    internal_by_depth = [sum(1 for p in kept if len(p) == d and any(q[:-1] == p for q in kept))
                         for d in range(1, max(map(len, kept), default=0) + 1)]
    assert model.extend_sizes == [n for n in internal_by_depth if n]


def test_static_tree_rank_example():
    model = TableDraftModel(16, seed=5)
    paths = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    req = request([3, 4], 16, 5)
    tree = StaticTree(paths=paths).build(model, req)
    assert tree.parent_list == [-1, -1, 0, 0, 1, 2]
    root = model.logits_for([3, 4]).argsort(descending=True)
    best = int(root[0])
    below = model.logits_for([3, 4, best]).argsort(descending=True)
    assert tree.tokens[0, :2].tolist() == root[:2].tolist()
    assert int(tree.tokens[0, 3]) == int(below[1])  # path (0, 1): the second most likely after the best
    assert model.extend_sizes == [2, 1]  # depth 1: both nodes have children; depth 2: only (0, 0)


def test_static_tree_drops_deep_paths_and_helpers():
    model = TableDraftModel(10, seed=1)
    builder = StaticTree.from_branching((3, 2, 1))
    assert len(builder.paths) == 3 + 6 + 6 and builder.depth == 3
    tree = builder.build(model, request([1], 10, 2))
    assert tree.num_nodes == 9 and tree.depth == 2
    assert StaticTree.chain(3).paths == ((0,), (0, 0), (0, 0, 0))
    assert StaticTree(paths=[[0, 0], [1], [0]]).paths == ((0,), (1,), (0, 0))  # normalised and sorted
    assert StaticTree(paths=((0,), (1,), (0, 0))).parent_list == [-1, -1, 0]


# ---------------------------------------------------------------------------------------------------------
# Chain as a special case of the other shapes


@FAST
@given(setup=setups(max_batch=1), k=st.integers(min_value=1, max_value=6))
def test_chain_is_the_special_case_under_greedy(setup, k):
    model, req = setup
    req = DraftRequest(input_ids=req.input_ids, sampling=GREEDY, vocab_size=req.vocab_size, max_depth=req.max_depth)
    chain = Chain(k).build(model, req)
    for other in (StaticTree.chain(k), DynamicTree(depth=k, top_k=1, budget=k)):
        tree = other.build(model, req)
        assert torch.equal(tree.tokens, chain.tokens), other
        assert tree.parent_list == chain.parent_list


# ---------------------------------------------------------------------------------------------------------
# DynamicTree


def reference_candidates(model, ids, sampling, depth, top_k) -> dict[tuple[int, ...], float]:
    """EAGLE-2's candidate set, written naively: every candidate path with its value (finite ones only)."""

    def children(path, value):
        logits = model.logits_for(ids + list(path))
        logp = logits.float().log_softmax(-1) if sampling.is_greedy else sampling.probs(logits).log()
        top = logp.topk(min(top_k, logp.shape[0]))
        return {path + (int(t),): value + float(v) for v, t in zip(top.values, top.indices, strict=True)
                if v > float("-inf")}

    candidates = children((), 0.0)
    frontier = dict(candidates)
    for _ in range(2, depth + 1):
        grow = sorted(frontier.items(), key=lambda item: -item[1])[:top_k]
        frontier = {}
        for path, value in grow:
            frontier.update(children(path, value))
        candidates.update(frontier)
    return candidates


@FAST
@given(setup=setups(), depth=st.integers(1, 5), top_k=st.integers(1, 4), budget=st.integers(1, 12))
def test_dynamic_tree_properties_and_selection(setup, depth, top_k, budget):
    model, req = setup
    tree = DynamicTree(depth=depth, top_k=top_k, budget=budget).build(model, req)
    check_tree(tree, req, model)
    assert tree.num_nodes <= budget and tree.depth <= min(depth, req.max_depth)
    assert tree.sampling == "deterministic" and tree.q is None
    assert len(model.extend_sizes) <= max(0, min(depth, req.max_depth) - 1)
    assert all(size <= top_k for size in model.extend_sizes)
    if req.max_depth == 0:
        return
    ids = req.input_ids[0].tolist()
    candidates = reference_candidates(model, ids, req.sampling, min(depth, req.max_depth), top_k)
    paths = node_paths(tree)
    assert set(paths) <= set(candidates)
    assert tree.num_nodes == min(budget, len(candidates))
    chosen = sorted((values_of(model, ids, p, req.sampling) for p in paths), reverse=True)
    best = sorted(candidates.values(), reverse=True)[: tree.num_nodes]
    assert chosen == pytest.approx(best, abs=1e-4)


def test_dynamic_tree_brute_force_on_the_full_tree():
    """With top_k >= V and depth 2 every depth-1 node is extended, so the tree must be the ``budget``
    sequences of length <= 2 with the highest probability, found here by enumerating all of them."""
    vocab = 4
    for seed, budget in itertools.product(range(5), (1, 3, 6, 20)):
        model = TableDraftModel(vocab, seed=seed)
        tree = DynamicTree(depth=2, top_k=vocab, budget=budget).build(model, request([1, 2], vocab, 4))
        everything = [(a,) for a in range(vocab)] + list(itertools.product(range(vocab), repeat=2))
        value = {p: values_of(model, [1, 2], p, GREEDY) for p in everything}
        best = sorted(everything, key=lambda p: -value[p])[:budget]
        assert set(node_paths(tree)) == set(best), (seed, budget)
        assert model.extend_sizes == [vocab]


class CountingModel:
    """A draft model that is certain: the only child of a depth-``d`` node is token ``d + 1`` (prob 1)."""

    def __init__(self, vocab: int):
        self.vocab, self.depths = vocab, []

    def _logits(self, depths: list[int]) -> torch.Tensor:
        logits = torch.full((1, len(depths), self.vocab), float("-inf"))
        logits[0, torch.arange(len(depths)), torch.tensor(depths) + 1] = 0.0
        return logits

    def begin(self, request):
        self.depths = []
        return self._logits([0])[:, 0]

    def extend(self, parents, tokens):
        new = [1 if p == -1 else self.depths[p] + 1 for p in parents.tolist()]
        self.depths += new
        return self._logits(new)


def test_dynamic_tree_keeps_ancestors_on_ties():
    """Probability-one children tie with their parents in value and zero-probability siblings are -inf:
    the kept nodes are the shallowest ones, never orphans."""
    tree = DynamicTree(depth=4, top_k=3, budget=3).build(CountingModel(8), request([5], 8, 8))
    assert tree.parent_list == [-1, 0, 1] and tree.tokens.tolist() == [[1, 2, 3]]


class FixedRootModel:
    """A draft model whose root children have the given logits; it is never extended."""

    def __init__(self, logits: list[float]):
        self.logits = torch.tensor([logits])

    def begin(self, request):
        return self.logits

    def extend(self, parents, tokens):  # pragma: no cover - depth 1 only
        raise AssertionError("depth-1 trees never extend")


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0)])
def test_dynamic_tree_top_one_is_the_first_maximal_child(sampling):
    """``top_k == 1`` takes the best child with ``max`` rather than ``topk``: the first of tied maxima, as
    :func:`specprim.sampling.argmax` (its log-probability is checked against the reference in the test above)."""
    logits = [0.0, 2.5, 2.5, 1.0, float("-inf")]
    tree = DynamicTree(depth=1, top_k=1, budget=1).build(FixedRootModel(logits), request([1], 5, 4, sampling))
    assert tree.tokens.tolist() == [[1]] and tree.parent_list == [-1]


def test_dynamic_tree_needs_batch_one():
    with pytest.raises(ValueError, match="batch size 1"):
        DynamicTree(depth=2, top_k=2, budget=3).build(TableDraftModel(5), request([[1], [2]], 5, 3))


# ---------------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("make", [
    lambda: Chain(0), lambda: Chain(True), lambda: Chain(2.0),
    lambda: DynamicTree(depth=0, top_k=1, budget=1), lambda: DynamicTree(depth=1, top_k=0, budget=1),
    lambda: DynamicTree(depth=1, top_k=1, budget=0), lambda: DynamicTree(depth=1.5, top_k=1, budget=1),
    lambda: StaticTree(paths=()), lambda: StaticTree(paths=((),)), lambda: StaticTree(paths=((0,), (0,))),
    lambda: StaticTree(paths=((-1,),)), lambda: StaticTree(paths=((0.0,),)), lambda: StaticTree(paths=((True,),)),
    lambda: StaticTree(paths="01"), lambda: StaticTree.from_branching(()), lambda: StaticTree.from_branching((2, 0)),
    lambda: StaticTree.chain(0),
])
def test_invalid_hyper_parameters_raise(make):
    with pytest.raises(ValueError):
        make()


def test_non_prefix_closed_paths_name_the_offender():
    with pytest.raises(ValueError, match=r"\(0, 1, 2\)"):
        StaticTree(paths=((0,), (0, 1, 2), (1,)))


def test_static_rank_beyond_the_vocabulary_raises():
    with pytest.raises(ValueError, match="rank"):
        StaticTree(paths=((0,), (5,))).build(TableDraftModel(4), request([1], 4, 3))


def test_table_model_checks_its_input():
    model = TableDraftModel(5)
    with pytest.raises(RuntimeError):
        model.extend(torch.tensor([-1]), torch.tensor([[0]]))
    model.begin(request([1, 2], 5, 3))
    with pytest.raises(ValueError):
        model.extend(torch.tensor([0]), torch.tensor([[0]]))  # node 0 does not exist yet
    with pytest.raises(ValueError):
        model.extend(torch.tensor([-1]), torch.tensor([[5]]))
    with pytest.raises(ValueError):
        model.begin(request([1], 6, 3))
    logits = model.extend(torch.tensor([-1, 0]), torch.tensor([[3, 4]]))  # a parent from the same call
    assert torch.equal(logits[0, 1], model.logits_for([1, 2, 3, 4]))
    assert model.scratch_paths == [[(3,), (3, 4)]] and model.extend_sizes == [2]
