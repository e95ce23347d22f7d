"""Hardware and model profiles of the simulator (datasheet figures and architecture shapes)."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.sim.calibration import GIB


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator: dense bf16 peak, HBM bandwidth and size, NVLink bandwidth per direction."""

    name: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    memory_bytes: int  # what the driver reports as total (torch.cuda.mem_get_info)
    nvlink_bytes_per_s: float  # per GPU, per direction
    fp8_kv: bool = True
    is_a100: bool = False

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


HARDWARE: dict[str, HardwareProfile] = {
    # A100 SXM4 80GB: 312 TFLOP/s dense bf16, 2.039 TB/s HBM2e, NVLink3 600 GB/s total (300 GB/s each way)
    "a100-80gb-sxm": HardwareProfile("a100-80gb-sxm", 312e12, 2.039e12, int(79.25 * GIB), 300e9, is_a100=True),
    # H100 SXM5 80GB: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, NVLink4 900 GB/s total (450 GB/s each way)
    "h100-sxm": HardwareProfile("h100-sxm", 989e12, 3.35e12, int(79.25 * GIB), 450e9),
    # H200 SXM 141GB: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e; h200.md: the lent H200 reports 140 GiB
    "h200": HardwareProfile("h200", 989e12, 4.8e12, int(139.8 * GIB), 450e9),
}


@dataclass(frozen=True)
class ModelProfile:
    """A Llama-shaped dense decoder (bf16 weights, untied embeddings, SwiGLU MLP, GQA)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    weight_bytes_per_param: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        d, hd = self.hidden, self.head_dim
        attn = d * self.heads * hd * 2 + d * self.kv_heads * hd * 2  # q, o and k, v
        mlp = 3 * d * self.ffn  # gate, up, down
        return attn + mlp

    @property
    def linear_params(self) -> int:
        """Parameters every token multiplies through (all layers; not the embedding lookup or lm head)."""
        return self.layers * self.layer_params

    @property
    def params(self) -> int:
        return self.linear_params + 2 * self.vocab * self.hidden  # embedding + untied lm head

    @property
    def weight_bytes(self) -> int:
        return self.params * self.weight_bytes_per_param

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token on one GPU (KV heads are split over TP ranks, replicated past kv_heads)."""
        heads_per_gpu = -(-self.kv_heads // tp)
        return 2 * self.layers * heads_per_gpu * self.head_dim * kv_dtype_bytes


MODELS: dict[str, ModelProfile] = {
    # 1.10 B parameters, 2.21 GB bf16: the model measured in h200.md
    "llama-1.1b": ModelProfile("llama-1.1b", hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=32000),
    # 8.03 B parameters, 16.1 GB bf16
    "llama-3-8b": ModelProfile("llama-3-8b", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
                               vocab=128256),
    # 70.6 B parameters, 141 GB bf16
    "llama-3-70b": ModelProfile("llama-3-70b", hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672,
                                vocab=128256),
}
