"""The Triton program for tree attention and its launcher. Imported lazily: importing it requires triton.

Triton reads ``TRITON_INTERPRET`` when a function is decorated with ``@triton.jit``: for the kernels below when
this module is first imported, and for ``triton.language``'s own helpers (``tl.zeros``, ``tl.sum``, ...) when
triton is first imported, which torch and transformers may do early. :data:`INTERPRETED` is True only when both
were built for the interpreter.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _online_softmax_step(
    q, k, v, allowed, m_i, l_i, acc, qk_scale, INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr
):
    """Fold one key block into the running softmax state.

    q (BLOCK_Q, BLOCK_D), k and v (BLOCK_K, BLOCK_D), allowed (BLOCK_Q, BLOCK_K) bool; m_i and l_i (BLOCK_Q,)
    float32 running max (base-2 logits) and normaliser; acc (BLOCK_Q, BLOCK_D) float32 unnormalised output.
    Rows that have seen no allowed key keep m_i = -inf, l_i = 0 and acc = 0 (no NaN). ``DOT_IN_FP32`` upcasts
    16-bit operands before ``tl.dot`` (the interpreter's 16-bit dot is wrong), after the same rounding.
    """
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale  # (BLOCK_Q, BLOCK_K), base 2
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))  # (BLOCK_Q,)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp2(m_i - m_safe)  # (BLOCK_Q,) rescales the old state
    probs = tl.exp2(scores - m_safe[:, None])  # (BLOCK_Q, BLOCK_K), 0 where masked
    l_i = l_i * alpha + tl.sum(probs, axis=1)
    probs = probs.to(v.dtype)  # 16-bit P @ V on tensor cores, as in flash attention
    if DOT_IN_FP32:
        probs = probs.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(probs, v, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _tree_attention_fwd(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr,
    stride_qb, stride_qh, stride_qq, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_mb, stride_mq, stride_mk,
    stride_ob, stride_oh, stride_oq, stride_od,
    num_heads, group_size, tree_len, prefix_len, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """One program per (query block, batch row x query head).

    Keys ``[0, prefix_len)`` are visible to every query (no mask load); keys ``prefix_len + j`` for
    ``j < tree_len`` are visible to query ``i`` iff ``mask[b, i, j]`` is non-zero.
    """
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1)
    batch = (pid_bh // num_heads).to(tl.int64)
    head = (pid_bh % num_heads).to(tl.int64)
    kv_head = head // group_size

    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BLOCK_Q,) query index in the tree block
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    row_ok = rows < tree_len
    dim_ok = dims < HEAD_DIM

    q_base = q_ptr + batch * stride_qb + head * stride_qh
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh
    mask_base = mask_ptr + batch * stride_mb

    q = tl.load(q_base + rows[:, None] * stride_qq + dims[None, :] * stride_qd,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_Q, BLOCK_D)

    m_i = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)

    # committed prefix: every query sees every key, so only the bounds are masked
    for start in range(0, prefix_len, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BLOCK_K,) key index
        col_ok = cols < prefix_len
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        allowed = (rows[:, None] >= 0) & col_ok[None, :]  # (BLOCK_Q, BLOCK_K)
        m_i, l_i, acc = _online_softmax_step(
            q, k, v, allowed, m_i, l_i, acc, qk_scale, INPUT_PRECISION, DOT_IN_FP32
        )

    # tree block: the compact (tree_len, tree_len) mask decides visibility
    for start in range(0, tree_len, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BLOCK_K,) index inside the tree block
        col_ok = cols < tree_len
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        keys_at = prefix_len + cols
        k = tl.load(k_base + keys_at[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys_at[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        visible = tl.load(mask_base + rows[:, None] * stride_mq + cols[None, :] * stride_mk,
                          mask=row_ok[:, None] & col_ok[None, :], other=0)  # (BLOCK_Q, BLOCK_K) uint8
        m_i, l_i, acc = _online_softmax_step(
            q, k, v, visible != 0, m_i, l_i, acc, qk_scale, INPUT_PRECISION, DOT_IN_FP32
        )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # rows that saw nothing stay 0
    out_base = out_ptr + batch * stride_ob + head * stride_oh
    tl.store(out_base + rows[:, None] * stride_oq + dims[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])


INTERPRETED: bool = isinstance(_tree_attention_fwd, InterpretedFunction) and isinstance(
    getattr(tl.standard, "zeros", None), InterpretedFunction
)
"""True when the kernels above, and triton.language's own jit helpers, run in Triton's CPU interpreter."""


def _block_sizes(tree_len: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_K, BLOCK_D): powers of two, at least 16 (the smallest ``tl.dot`` tile)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_q = min(64, max(16, triton.next_power_of_2(tree_len)))
    block_k = 64 if block_d <= 64 else 32
    return block_q, block_k, block_d


def launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, prefix_length: int, scale: float
) -> torch.Tensor:
    """Run the kernel on validated inputs (see :func:`specprim.kernels.tree_attention`).

    q (B, H, Q, D); k, v (B, Hkv, P + Q, D); mask (B, Q, Q) uint8 (batch stride 0 when shared).
    Returns (B, H, Q, D) of ``q.dtype``.
    """
    batch, num_heads, tree_len, head_dim = q.shape
    group_size = num_heads // k.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (B, H, Q, D)
    block_q, block_k, block_d = _block_sizes(tree_len, head_dim)
    precision = "ieee" if q.dtype == torch.float32 or INTERPRETED else "tf32"  # tf32: default, ignored for 16-bit
    dot_in_fp32 = INTERPRETED and q.dtype != torch.float32
    grid = (triton.cdiv(tree_len, block_q), batch * num_heads)
    _tree_attention_fwd[grid](
        q, k, v, mask, out,
        *q.stride(), *k.stride(), *v.stride(), *mask.stride(), *out.stride(),
        num_heads, group_size, tree_len, prefix_length, scale * math.log2(math.e),
        HEAD_DIM=head_dim, BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_D=block_d, INPUT_PRECISION=precision,
        DOT_IN_FP32=dot_in_fp32,
        num_warps=4 if block_d <= 64 else 8,
    )
    return out
