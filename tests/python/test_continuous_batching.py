"""transformers' continuous batching served by attn (attn.integrations.continuous_batching):
the same greedy tokens as transformers' own "sdpa" path, the manager's cache read in place
(transformers' gather never runs under attn_paged), requests arriving while others decode,
chunked prefills, and other models left as they were."""

import time

import pytest
import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.continuous_batching.cache_allocators.full_attention import (
    FullAttentionCacheAllocator,
)

import attn
import attn.integrations.continuous_batching as cb

NEW_TOKENS = 8


def llama(seed=0):
    """A random Llama-style model: 4 layers, GQA (4 query heads over 2 KV heads)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def prompts(lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 128, (n,), generator=generator).tolist() for n in lengths]


def generation_config():
    return GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1,
                            pad_token_id=0)


def batching_config():
    """Small pages and batches: long prompts are prefilled in chunks beside others' decodes."""
    return ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=24,
                                    max_blocks_per_request=0)


def generate(model, implementation, inputs):
    model.set_attn_implementation(implementation)
    outputs = model.generate_batch(inputs, generation_config=generation_config(),
                                   continuous_batching_config=batching_config())
    model.destroy_cached_continuous_batching_manager()
    return [outputs[f"req_{i}"].generated_tokens for i in range(len(inputs))]


@pytest.fixture
def gathers(monkeypatch):
    """Counts transformers' own cache updates (write, then gather the whole cache)."""
    calls = []
    original = FullAttentionCacheAllocator.update

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FullAttentionCacheAllocator, "update", counted)
    return calls


def test_generate_batch_gives_sdpa_tokens_reading_the_cache_in_place(gathers, monkeypatch):
    model = llama()
    inputs = prompts([5, 3, 40, 17, 1, 29])
    expected = generate(model, "sdpa", inputs)
    assert len(gathers) > 0
    gathers.clear()
    calls = []
    original = attn._paged.paged_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(attn._paged, "paged_attention", counted)
    cb.register()
    assert generate(model, cb.NAME, inputs) == expected
    assert all(len(tokens) == NEW_TOKENS for tokens in expected)
    assert gathers == [], "attn_paged must not gather the cache"
    assert len(calls) > 0


def test_requests_arriving_while_others_decode():
    model = llama(seed=3)
    first, later = prompts([33, 4, 12], seed=5), prompts([21, 2, 47], seed=6)
    expected = generate(model, "sdpa", first + later)
    cb.register()
    model.set_attn_implementation(cb.NAME)
    manager = model.init_continuous_batching(generation_config=generation_config(),
                                             continuous_batching_config=batching_config())
    manager.start()
    try:
        ids = [manager.add_request(p, request_id=f"first_{i}") for i, p in enumerate(first)]
        # The later requests come once the first ones are decoding.
        started = manager.get_result(request_id=None, timeout=60)
        assert started is not None
        ids += [manager.add_request(p, request_id=f"later_{i}") for i, p in enumerate(later)]
        results = {started.request_id: started}
        deadline = time.monotonic() + 120
        while len(results) < len(ids) and time.monotonic() < deadline:
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result
    finally:
        manager.stop(block=True)
        model.destroy_cached_continuous_batching_manager()
    assert [results[i].generated_tokens for i in ids] == expected


def test_other_models_keep_transformers_path(gathers):
    cb.register()
    model = llama(seed=7)
    inputs = prompts([6, 9])
    generate(model, "sdpa", inputs)
    assert len(gathers) > 0


def test_refuses_dropout_and_masks():
    module = torch.nn.Module()
    q = torch.zeros(1, 2, 3, 8)
    k = torch.zeros(1, 1, 3, 8)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(attn.Error, match="dropout"):
        cb.attention_forward(module, q, k, k, None, dropout=0.1, cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu)
    with pytest.raises(attn.Error, match="attention_mask"):
        cb.attention_forward(module, q, k, k, torch.zeros(1, 1, 3, 3), cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu)


def test_gathered_keys_match_sdpa():
    """A layer not read in place (transformers' gathered copy) goes through the same kernel:
    a ragged batch [prefill of 3, decode of 1 over 4 keys] against SDPA per sequence."""
    torch.manual_seed(2)
    q = torch.randn(1, 4, 4, 8)
    k, v = torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 7], dtype=torch.int32)
    padded = torch.cat([q, torch.zeros(1, 4, 2, 8)], 2)  # two rows of padding after the batch
    out, weights = cb.attention_forward(torch.nn.Module(), padded, k, v, None, scaling=0.3,
                                        cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k)
    assert weights is None and out.shape == (1, 6, 4, 8)
    assert torch.equal(out[0, 4:], torch.zeros(2, 4, 8))
    for s in range(2):
        qs = q[:, :, cu_q[s]:cu_q[s + 1]]
        ks, vs = (x[:, :, cu_k[s]:cu_k[s + 1]].repeat_interleave(2, 1) for x in (k, v))
        len_q, len_k = qs.shape[2], ks.shape[2]
        mask = torch.ones(len_q, len_k, dtype=torch.bool).tril(len_k - len_q)
        reference = torch.nn.functional.scaled_dot_product_attention(
            qs.double(), ks.double(), vs.double(), attn_mask=mask, scale=0.3)
        torch.testing.assert_close(out[0, cu_q[s]:cu_q[s + 1]].double(),
                                   reference[0].transpose(0, 1), rtol=1e-5, atol=1e-6)


def test_a_transformers_without_token_views_is_named():
    """The one private attribute read (the allocator's token views) is checked, and its
    absence refused with an error naming transformers, before anything is written."""
    from types import SimpleNamespace

    allocator = FullAttentionCacheAllocator.__new__(FullAttentionCacheAllocator)
    allocator.index, allocator.layer_type = 0, "full_attention"
    cache = SimpleNamespace(config=SimpleNamespace(_attn_implementation=cb.NAME),
                            layer_to_allocator={0: allocator})
    cu = torch.tensor([0, 2], dtype=torch.int32)
    kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k={"full_attention": cu},
                  max_length_k={"full_attention": 2}, write_index=[torch.tensor([0, 1])],
                  read_index=None)
    states = torch.zeros(1, 2, 2, 8)
    with pytest.raises(attn.Error, match="^transformers: attn_paged reads"):
        cb._update(cache, states, states, 0, kwargs)
