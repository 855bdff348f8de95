"""attn inside other libraries: attn.integrations.transformers.register() makes attn an
attention implementation of Hugging Face transformers; attn.integrations.continuous_batching
serves transformers' continuous batching (generate_batch) over its own paged cache, in
place; attn.integrations.flash_attn is FlashAttention's Python API (flash_attn_func,
flash_attn_varlen_func, the packed forms and flash_attn_with_kvcache) on CPU."""
