"""Layer 2 of the runtime: what users call. torch SDPA integration,
flash-attn's API (``aotriton_rocm.flash_attn_interface``) and its torch
operators (``torch.ops.aotriton_rocm.*``), the KV-cache API and
``AttentionMode``."""
