"""attn inside other libraries: attn.integrations.transformers.register() makes attn an
attention implementation of Hugging Face transformers."""
