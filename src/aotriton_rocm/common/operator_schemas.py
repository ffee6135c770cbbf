"""The schemas of aotriton_rocm's torch operators (flash_attn_ops.py defines
them, torch_native.py gives the C++ extension their argument kinds), in one
place: the C++ kernel reads its arguments by position."""

FLASH_ATTN_FORWARD = (
    "flash_attn_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
    "int max_seqlen_q, int max_seqlen_k, float dropout_p, float? softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "bool return_debug_mask, bool deterministic) -> (Tensor, Tensor, Tensor, Tensor)")
FLASH_ATTN_BACKWARD = (
    "flash_attn_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
    "Tensor softmax_lse, Tensor rng_state, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
    "int max_seqlen_q, int max_seqlen_k, float dropout_p, float? softmax_scale, bool causal, "
    "int window_left, int window_right, float softcap, Tensor? alibi_slopes, "
    "bool deterministic) -> (Tensor, Tensor, Tensor)")
FLASH_ATTN_KVCACHE = (
    "flash_attn_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor k_end, Tensor? k_start, "
    "Tensor? cache_batch_idx, Tensor? block_table, Tensor? alibi_slopes, float? softmax_scale, "
    "bool causal, int window_left, int window_right, float softcap, int num_splits, "
    "Tensor? cu_seqlens_q, int max_seqlen_q, str api) -> (Tensor, Tensor)")
