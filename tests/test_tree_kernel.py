"""The Triton tree-attention kernel against SDPA, in Triton's CPU interpreter: random shapes (GQA, batch,
empty prefix, per-row masks, 16-bit dtypes), a broken mask that the comparison must catch, input errors,
the transformers attention dispatch, and greedy parity of a tiny Llama with and without the kernel.

Triton picks interpreter or compiler when a function is decorated: its own ``triton.language`` helpers when
triton is first imported (importing transformers does that), our kernels when ``specprim.kernels._triton_kernel``
is. So ``TRITON_INTERPRET=1`` is set here before either, when this module is the first to import triton. In a
full test run triton is already imported by then: the kernel tests are skipped in-process and
``test_kernel_tests_in_a_fresh_process`` runs this file again in a fresh interpreter-mode process.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_CHILD = "SPECPRIM_TREE_KERNEL_CHILD"  # set in the fresh process, so that it never spawns another
_saved_interpret = os.environ.get("TRITON_INTERPRET")
_FRESH = "triton" not in sys.modules  # nothing has imported triton (nor transformers) yet
if _FRESH:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="triton is not installed (pip install triton); the kernel tests need it")
import specprim.kernels  # noqa: E402

_BUILT_ON_PACKAGE_IMPORT = "specprim.kernels._triton_kernel" in sys.modules
from specprim.kernels import _triton_kernel  # noqa: E402  (builds the kernels, for the interpreter if set above)

if _saved_interpret is None:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = _saved_interpret

from _tiny import VOCAB, tiny_causal_lm  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

import specprim.kernels._hf_attention as hf_attention  # noqa: E402
from specprim import speculative_generate  # noqa: E402
from specprim.acceptance import Greedy  # noqa: E402
from specprim.drafters import ModelDrafter  # noqa: E402
from specprim.kernels import (  # noqa: E402
    tree_attention,
    tree_attention_forward,
    tree_attention_reference,
    use_tree_kernel,
)
from specprim.masks import tree_verification_mask  # noqa: E402
from specprim.trees import StaticTree  # noqa: E402

in_process = pytest.mark.skipif(
    not _triton_kernel.INTERPRETED,
    reason="triton was imported before TRITON_INTERPRET=1 could be set; test_kernel_tests_in_a_fresh_process "
    "runs these",
)


@pytest.mark.skipif(_triton_kernel.INTERPRETED or _CHILD in os.environ, reason="the kernel tests run in-process")
def test_kernel_tests_in_a_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1", _CHILD: "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).resolve())],
        cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]  # e.g. "12 passed, 1 skipped in 20.1s": only this test skips
    assert " passed" in summary and ("skipped" not in summary or "1 skipped" in summary), result.stdout[-3000:]


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_parents(num_nodes: int, generator: torch.Generator) -> list[int]:
    """A random topological tree: node ``i`` hangs below the root or a random earlier node."""
    return [int(torch.randint(-1, i, (1,), generator=generator)) if i else -1 for i in range(num_nodes)]


block_mask = specprim.kernels.tree_block_mask


def random_qkv(batch, heads, kv_heads, tree_len, prefix, head_dim, dtype, generator):
    """q (B, H, Q, D) and k, v (B, Hkv, P + Q, D), laid out as transformers makes them (non-contiguous)."""
    q = torch.randn(batch, tree_len, heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    k = torch.randn(batch, prefix + tree_len, kv_heads, head_dim, generator=generator).to(dtype).transpose(1, 2)
    v = torch.randn(batch, kv_heads, prefix + tree_len, head_dim, generator=generator).to(dtype)
    return q, k, v


CASES = [  # (num_nodes, prefix, batch, heads, kv_heads, head_dim, per_row_mask)
    (1, 0, 1, 2, 2, 16, False),
    (6, 0, 2, 4, 2, 16, False),
    (9, 5, 1, 4, 1, 24, False),
    (20, 70, 2, 4, 2, 32, True),
    (40, 130, 1, 2, 2, 64, False),
    (3, 1, 2, 6, 3, 128, True),
]


@in_process
@pytest.mark.parametrize("case", CASES, ids=[f"N{c[0]}-P{c[1]}-B{c[2]}-H{c[3]}/{c[4]}-D{c[5]}" for c in CASES])
def test_kernel_matches_sdpa_fp32(case):
    num_nodes, prefix, batch, heads, kv_heads, head_dim, per_row = case
    gen = torch.Generator().manual_seed(num_nodes * 1000 + prefix)
    if per_row:
        mask = torch.stack([block_mask(random_parents(num_nodes, gen)) for _ in range(batch)])  # (B, Q, Q)
    else:
        mask = block_mask(random_parents(num_nodes, gen))  # (Q, Q)
    q, k, v = random_qkv(batch, heads, kv_heads, num_nodes + 1, prefix, head_dim, torch.float32, gen)
    out = tree_attention(q, k, v, mask, prefix)
    expected = tree_attention_reference(q, k, v, mask, prefix)
    assert out.shape == (batch, heads, num_nodes + 1, head_dim)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@in_process
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_matches_sdpa_16_bit(dtype):
    gen = torch.Generator().manual_seed(7)
    mask = block_mask(random_parents(12, gen))
    q, k, v = random_qkv(2, 4, 2, 13, 45, 32, dtype, gen)
    out = tree_attention(q, k, v, mask, 45, scale=0.2)
    assert out.dtype == dtype
    expected = tree_attention_reference(q.float(), k.float(), v.float(), mask, 45, scale=0.2)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@in_process
def test_comparison_catches_a_node_that_sees_its_sibling():
    parents = [-1, -1, 0, 0, 1]  # nodes 0 and 1 are siblings, so are 2 and 3
    good = block_mask(parents)
    broken = good.clone()
    broken[2, 1] = True  # node 1 (row/column 2) sees its sibling node 0 (column 1)
    gen = torch.Generator().manual_seed(3)
    q, k, v = random_qkv(1, 2, 2, 6, 8, 16, torch.float32, gen)
    expected = tree_attention_reference(q, k, v, good, 8)
    out = tree_attention(q, k, v, broken, 8)
    assert not torch.allclose(out, expected, atol=1e-3)
    assert torch.allclose(out[:, :, [0, 1, 3, 4, 5]], expected[:, :, [0, 1, 3, 4, 5]], atol=1e-5)  # only row 2


@in_process
def test_bad_inputs_raise_clear_errors():
    gen = torch.Generator().manual_seed(0)
    q, k, v = random_qkv(1, 4, 2, 3, 2, 16, torch.float32, gen)
    mask = block_mask([-1, 0])
    with pytest.raises(TypeError, match="dtype"):
        tree_attention(q.double(), k.double(), v.double(), mask, 2)
    with pytest.raises(TypeError, match="share a dtype"):
        tree_attention(q, k.half(), v, mask, 2)
    with pytest.raises(TypeError, match="bool"):
        tree_attention(q, k, v, mask.float(), 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tree_attention(q.numpy(), k, v, mask, 2)
    with pytest.raises(ValueError, match="prefix_length"):
        tree_attention(q, k, v, mask, 3)
    with pytest.raises(ValueError, match="tree_mask must have shape"):
        tree_attention(q, k, v, mask[:2, :2], 2)
    with pytest.raises(ValueError, match="must divide"):
        tree_attention(q[:, :3], k, v, mask, 2)
    with pytest.raises(ValueError, match="4D"):
        tree_attention(q[0], k, v, mask, 2)
    with pytest.raises(ValueError, match="head_dim 256"):
        big = torch.zeros(1, 2, 3, 256)
        tree_attention(big, big, big, mask, 0)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        os.environ["TRITON_INTERPRET"] = "0"
        tree_attention(q, k, v, mask, 2)


@in_process
def test_attention_function_uses_the_kernel_only_for_tree_calls(monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[3])
        return tree_attention(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "tree_attention", counting)
    gen = torch.Generator().manual_seed(5)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    parents = random_parents(10, gen)
    q, k, v = random_qkv(2, 4, 2, 11, 30, 16, torch.float32, gen)
    mask = tree_verification_mask(parents, 30, batch_size=2)  # (2, 1, 11, 41) additive
    out, _ = tree_attention_forward(module, q, k, v, mask, scaling=0.25)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert len(calls) == 1 and out.shape == (2, 11, 4, 16)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)

    padded = mask.clone()
    padded[1, :, :, 0] = torch.finfo(torch.float32).min  # a left-padded row: not every prefix key is visible
    out, _ = tree_attention_forward(module, q, k, v, padded, scaling=0.25)
    torch.testing.assert_close(out, sdpa_attention_forward(module, q, k, v, padded, scaling=0.25)[0])
    out, _ = tree_attention_forward(module, q[:, :, :1], k[:, :, :31], v[:, :, :31], None, scaling=0.25)
    assert len(calls) == 1  # neither the padded batch nor one-token decoding used the kernel


@in_process
def test_greedy_generation_with_the_kernel_matches_sdpa(monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return tree_attention(*args, **kwargs)

    monkeypatch.setattr(hf_attention, "tree_attention", counting)
    target = tiny_causal_lm("llama", seed=0)
    draft = tiny_causal_lm("llama", seed=1)
    prompt = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    tree = StaticTree(paths=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))

    def run():
        out = speculative_generate(
            target, prompt, drafter=ModelDrafter(draft, tree), acceptance=Greedy(), max_new_tokens=24
        )
        return out.sequences

    with_sdpa = run()
    previous = use_tree_kernel(target)
    assert previous == "sdpa" and target.config._attn_implementation == "specprim_tree"
    with_kernel = run()
    target.set_attn_implementation(previous)
    assert calls, "the kernel was never used"
    assert torch.equal(with_kernel, with_sdpa)
    reference = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                                do_sample=False, pad_token_id=0)
    assert torch.equal(with_kernel, reference)


@pytest.mark.skipif(not _FRESH, reason="specprim.kernels was imported before this module could watch")
def test_importing_specprim_kernels_does_not_build_the_kernels():
    assert not _BUILT_ON_PACKAGE_IMPORT


def test_only_the_kernel_module_imports_triton():
    package = Path(specprim.kernels.__file__).resolve().parents[1]  # specprim/
    importers = [
        path.relative_to(package).as_posix()
        for path in sorted(package.rglob("*.py"))
        if re.search(r"^\s*(import|from)\s+triton\b", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    ]
    assert importers == ["kernels/_triton_kernel.py"]


def test_tree_block_mask_is_the_tree_block_of_the_verification_mask():
    parents = [-1, -1, 0, 1, 3, 3]
    full = tree_verification_mask(parents, 5, dtype=torch.float32)[0, 0]  # (1 + N, 5 + 1 + N) additive
    assert torch.equal(specprim.kernels.tree_block_mask(parents), full[:, 5:] == 0)
