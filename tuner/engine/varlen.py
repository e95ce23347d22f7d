"""Variable-length attention for `attention=flash`: torch's bundled FlashAttention-2 kernel, called on the
KV pool as it lies, with each sequence's own length (`seqused_k`) instead of a mask.

The decode step treats every (slot, KV head) pair as one sequence: the pool's k of one layer,
[slots, kv_heads, positions, head_dim], is one contiguous run of `slots x kv_heads` sequences of
`positions` keys each, with one KV head; its query is that KV head's group of query heads (one query
token, G heads: grouped-query attention inside the kernel). The kernel reads only the first `seqused_k[i]`
keys of sequence i, so nothing past a row's position is read or masked, and one K/V read serves the whole
group. This is the form FlashAttention's own decode path (`seqlen_q == 1` with GQA) is fastest on.

The kernel exists only on CUDA (sm80 or later, bfloat16 or float16): `VarlenAttention.unavailable` says
why it cannot run on a device in a dtype. Tests on a CPU pass a reference implementation of the same contract
(tests/support/gpu_doubles.py); the GPU checks compare the kernel with the SDPA step.
"""

from __future__ import annotations

from typing import Any

import torch

FLASH_DTYPES = ("bfloat16", "float16")


class VarlenAttention:
    """out[t] for query token t of sequence i (cu_q[i] <= t < cu_q[i+1]): softmax(scale * q[t] k^T) v over
    keys cu_k[i] .. cu_k[i] + seqused_k[i] - 1, GQA over the head axis (query head h reads KV head
    h // (Hq / Hkv)). Shapes: q [Tq, Hq, D], k and v [Tk, Hkv, D]; cu_q, cu_k [N + 1] and seqused_k [N], int32.
    Returns [Tq, Hq, D]. No causal mask: a decode query sees every key it is given.

    Production: torch's FlashAttention-2 kernel (aten::_flash_attention_forward, varlen form)."""

    def unavailable(self, device: str, dtype: str, head_dim: int | None = None) -> str | None:
        """Why the kernel cannot run on `device` in `dtype` (a name: "bfloat16") for heads of `head_dim`
        (when known), or None when it can."""
        if dtype not in FLASH_DTYPES:
            return f"the flash kernel runs in {' or '.join(FLASH_DTYPES)} only"
        if head_dim is not None and (head_dim % 8 or head_dim > 256):
            return f"the flash kernel needs a head dimension that is a multiple of 8 and at most 256 (not {head_dim})"
        if not device.startswith("cuda"):
            return "torch's flash kernel needs a CUDA GPU"
        schema = str(torch.ops.aten._flash_attention_forward.default._schema)
        if "seqused_k" not in schema:
            return f"this torch ({torch.__version__}) has no seqused_k in its flash kernel"
        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU"
        if not torch.cuda.is_initialized():
            # reading the capability would create a CUDA context here (the tuner's own process must not hold
            # one): an older GPU is then refused by the kernel itself, at the engine's first decode step
            return None
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if major < 8:
            return f"the flash kernel needs compute capability 8.0 or later (this GPU: {major}.{minor})"
        return None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                 cu_k: torch.Tensor, max_q: int, max_k: int, seqused_k: torch.Tensor, scale: float) -> torch.Tensor:
        out: Any = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False, scale=scale, seqused_k=seqused_k)
        return out[0]
