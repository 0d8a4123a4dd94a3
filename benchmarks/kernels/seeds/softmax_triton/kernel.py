"""Triton softmax for the ``softmax`` problem: one program per row, online max/sum, fp32 inside.

``run(x, y)``: x [R, C] bf16, y [R, C] bf16. Pass one walks the row in chunks of
BLOCK_SIZE keeping a running maximum and a rescaled running sum (the online softmax of
Milakov and Gimelshein, 2018); pass two writes exp(x - max) / sum.
"""

import torch
import triton
import triton.language as tl

# EVOLVE-BLOCK-START
BLOCK_SIZE = 2048
NUM_WARPS = 8
NUM_STAGES = 2
# EVOLVE-BLOCK-END


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        s = s * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        tl.store(y_row + cols, (tl.exp(x - row_max) / total).to(y_ptr.dtype.element_ty), mask=mask)


def run(x: torch.Tensor, y: torch.Tensor) -> None:
    """Destination-passing softmax over the last axis: writes into ``y``."""
    rows, cols = x.shape
    _softmax_kernel[(rows,)](
        x,
        y,
        x.stride(0),
        y.stride(0),
        cols,
        BLOCK=BLOCK_SIZE,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
