"""The Triton tree-attention kernel on a CUDA device, at GPU-sized shapes: against a float64 SDPA reference (tree
sizes up to 128, prefixes up to 2048, GQA, batch 2 with per-row masks, float32 / bfloat16 / float16, a padded head
size), a broken mask (a node that sees its sibling) that the same comparison must reject, and the transformers
attention function against transformers' SDPA function.

Marked ``cuda`` and skipped without a CUDA device: ``pytest -m cuda tests/test_gpu_kernel.py`` on a GPU machine
(``benchmarks/gpu.sh`` runs it before the timings of ``docs/studies/gpu_timing.py``). On CPU the same comparisons run
at small shapes in Triton's interpreter in ``tests/test_tree_kernel.py``.
"""

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOLERANCE = {torch.float32: 5e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}  # abs and rel, against float64
CASES = [  # N draft nodes, P prefix, B batch, H heads, Hkv key/value heads, D head size, per-row masks
    (16, 0, 1, 9, 3, 64, False),
    (64, 512, 2, 9, 3, 64, True),
    (128, 2048, 1, 9, 3, 64, False),
    (31, 1000, 2, 32, 8, 128, True),
    (7, 37, 3, 4, 4, 80, False),  # head size 80: padded to a power of two inside the kernel
    (1, 5, 1, 2, 1, 16, False),
]


@pytest.fixture(scope="module")
def kernels():
    """``specprim.kernels`` compiled for the GPU (never Triton's interpreter here)."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton)")
    import specprim.kernels

    return specprim.kernels


def _random_parents(num_nodes: int, generator: torch.Generator) -> list[int]:
    """A random topological tree: node ``i`` hangs below the root (-1) or an earlier node."""
    return [int(torch.randint(-1, i, (1,), generator=generator)) if i else -1 for i in range(num_nodes)]


def _random_qkv(b: int, h: int, hkv: int, q_len: int, p: int, d: int, dtype: torch.dtype, generator: torch.Generator):
    """q (B, H, Q, D), k and v (B, Hkv, P + Q, D) on the GPU, in the non-contiguous layout transformers produces."""
    q = torch.randn(b, q_len, h, d, generator=generator).to("cuda", dtype).transpose(1, 2)
    k = torch.randn(b, p + q_len, hkv, d, generator=generator).to("cuda", dtype).transpose(1, 2)
    v = torch.randn(b, p + q_len, hkv, d, generator=generator).to("cuda", dtype).transpose(1, 2)
    return q, k, v


def _matches(out: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> bool:
    return torch.allclose(out.double(), reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "N{}-P{}-B{}-H{}x{}-D{}{}".format(*c[:6], "-rows" * c[6]))
def test_kernel_matches_float64_sdpa(kernels, case, dtype):
    from specprim.kernels import tree_block_mask

    n, p, b, h, hkv, d, per_row = case
    generator = torch.Generator().manual_seed(0)
    trees = [tree_block_mask(_random_parents(n, generator)) for _ in range(b if per_row else 1)]  # (Q, Q) each
    mask = (torch.stack(trees) if per_row else trees[0]).cuda()  # (B, Q, Q) or (Q, Q)
    q, k, v = _random_qkv(b, h, hkv, n + 1, p, d, dtype, generator)
    out = kernels.tree_attention(q, k, v, mask, p)  # (B, H, Q, D)
    reference = kernels.tree_attention_reference(q.double(), k.double(), v.double(), mask, p)
    assert out.shape == reference.shape == (b, h, n + 1, d)
    error = (out.double() - reference).abs().max().item()
    assert _matches(out, reference, dtype), f"max |error| {error:.3g} above {TOLERANCE[dtype]}"


def test_comparison_catches_a_node_that_sees_its_sibling(kernels):
    from specprim.kernels import tree_block_mask

    generator = torch.Generator().manual_seed(1)
    good = tree_block_mask([-1, -1, 0, 0, 1]).cuda()  # (6, 6)
    broken = good.clone()
    broken[2, 1] = True  # node 1 sees its sibling node 0
    q, k, v = _random_qkv(1, 4, 2, 6, 20, 32, torch.float32, generator)
    reference = kernels.tree_attention_reference(q.double(), k.double(), v.double(), good, 20)
    assert _matches(kernels.tree_attention(q, k, v, good, 20), reference, torch.float32)
    assert not _matches(kernels.tree_attention(q, k, v, broken, 20), reference, torch.float32)


def test_transformers_attention_function_matches_hf_sdpa(kernels):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specprim.kernels import tree_attention_forward
    from specprim.masks import tree_verification_mask

    generator = torch.Generator().manual_seed(2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    parents = _random_parents(24, generator)
    q, k, v = _random_qkv(2, 9, 3, 25, 300, 64, torch.float32, generator)
    mask = tree_verification_mask(parents, 300, batch_size=2, device="cuda")  # (2, 1, 25, 325) additive
    out, _ = tree_attention_forward(module, q, k, v, mask, scaling=0.125)
    reference, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.125)
    assert out.shape == reference.shape
    assert (out - reference).abs().max().item() < 1e-4
