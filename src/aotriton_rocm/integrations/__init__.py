"""Layer 2 of the runtime: what users call. torch SDPA integration,
flash-attn's torch operators (``torch.ops.aotriton_rocm.*``), the KV-cache
API and ``AttentionMode``. flash-attn's functions themselves stay at
``aotriton_rocm.flash_attn_interface``, the path of flash-attn's own module
(``flash_attn.flash_attn_interface``); they are layer 2 too."""
