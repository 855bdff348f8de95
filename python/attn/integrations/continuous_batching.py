"""transformers' continuous batching (model.generate_batch, the ContinuousBatchingManager
behind `transformers serve`) with its paged attention computed by attn, over the manager's
own cache, in place.

    import attn.integrations.continuous_batching as cb
    cb.register()
    model.set_attn_implementation(cb.NAME)   # or from_pretrained(..., attn_implementation=cb.NAME)
    outputs = model.generate_batch(inputs, generation_config=...)

On CPU, transformers' "sdpa" and "paged|eager" implementations write each step's keys and
values into the paged cache and then gather every sequence's whole cache (index_select)
into new tensors for SDPA: O(cache) copying per layer and step. Under NAME, each layer's new
keys and values are written into the cache's pages by attn.append_pages, and
attn.paged_attention reads every sequence's keys where they lie, through a table of their
cache slots (pages of one token, so any slot order serves), one call per layer for the
whole ragged batch of prefill chunks and decode steps. Rows past the batch's last query
(transformers' padding) get zeros.

transformers admits only "sdpa", "paged|eager" and flash-attn names to continuous batching,
and gathers the cache inside PagedAttentionCache.update before any attention function runs,
so register() also wraps those two methods: for a model set to NAME the manager keeps NAME
and update writes without gathering; for every other model both behave as before. Full
attention layers are read in place; any other layer type (sliding windows, MLA latents) is
served from transformers' gathered copy, by the same kernel.
"""

import torch
from transformers import AttentionInterface
from transformers import __version__ as transformers_version
from transformers.generation.continuous_batching import cache as _cb_cache
from transformers.generation.continuous_batching import continuous_api as _cb_api
from transformers.generation.continuous_batching.cache_allocators.full_attention import (
    FullAttentionCacheAllocator,
)

from .. import _paged
from .._errors import Error

NAME = "attn_paged"

_KEY = "attn_cache_slots"  # the kwargs entry update leaves for attention_forward


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      softcap=None, sliding_window=None, **kwargs):
    """transformers' attention function signature for a continuous batch: query
    [1, Hq, total_q, D] packed by cu_seq_lens_q, keys and values in the manager's cache (or,
    for layers not read in place, key/value [1, Hkv, total_k, D] packed by cu_seq_lens_k).
    Returns (out [1, total_q, Hq, Dv] in query's dtype, None)."""
    if dropout:
        raise Error(f"dropout: continuous batching serves inference; expected 0.0, given {dropout}")
    if attention_mask is not None:
        raise Error("attention_mask: expected None (continuous batching under attn_paged "
                    "builds no mask; causal order comes from cu_seq_lens_q and cu_seq_lens_k)")
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_k = kwargs["cu_seq_lens_k"].to(torch.int32)
    pages = kwargs.pop(_KEY, None)
    if pages is not None:
        key_pages, value_pages, slots = pages
    else:
        # A gathered copy [1, Hkv, total_k, D]: token i is slot i of one-token pages.
        key_pages, value_pages = (x[0].transpose(0, 1).contiguous().unsqueeze(1)
                                  for x in (key, value))
        slots = torch.arange(key_pages.shape[0], dtype=torch.int32)
    seq_lens = cu_k[1:] - cu_k[:-1]
    table = _slot_table(slots, cu_k, seq_lens)
    total_q = query.shape[2]
    used = int(cu_q[-1])
    q = query[0, :, :used].transpose(0, 1)
    options = {"causal": True, "scale": scaling, "softcap": softcap or 0.0}
    if sliding_window:
        options["window"] = (sliding_window - 1, 0)
    out = _paged.paged_attention(q, key_pages, value_pages, table, seq_lens, cu_q, **options)
    result = torch.zeros((1, total_q) + tuple(out.shape[1:]), dtype=query.dtype)
    result[0, :used] = out
    return result, None


def _slot_table(slots, cu_k, seq_lens):
    """[S, max_len] int32: row s holds sequence s's cache slots in token order (its
    read-index segment), zeros past its length."""
    sequences = seq_lens.numel()
    width = max(int(seq_lens.max()) if sequences else 0, 1)
    table = torch.zeros((sequences, width), dtype=torch.int32)
    starts = cu_k[:-1].to(torch.int64)
    columns = torch.arange(width, dtype=torch.int64)
    inside = columns.unsqueeze(0) < seq_lens.unsqueeze(1)
    index = (starts.unsqueeze(1) + columns.unsqueeze(0))[inside]
    table[inside] = slots.to(torch.int32)[index]
    return table


_original_update = _cb_cache.PagedAttentionCache.update
_original_switch = _cb_api.ContinuousBatchingManager.switch_to_cb_friendly_attn


def _update(self, key_states, value_states, layer_idx, kwargs):
    allocator = self.layer_to_allocator[layer_idx]
    if (self.config._attn_implementation != NAME or kwargs.get("block_table") is not None
            or type(allocator) is not FullAttentionCacheAllocator):
        return _original_update(self, key_states, value_states, layer_idx, kwargs)
    kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type].to(torch.int32)
    kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
    write = kwargs["write_index"][allocator.index]
    read = kwargs["read_index"][allocator.index] if kwargs.get("read_index") else write[:0]
    # The layer's token views: [tokens, Hkv, D], slot i being row i, as pages of one token;
    # the values' view starts a page later, so both are cut to its length.
    views = getattr(allocator, "_kv_token_views", None)
    if views is None:
        raise Error(f"transformers: {NAME} reads FullAttentionCacheAllocator._kv_token_views "
                    f"(transformers 5.25), which transformers {transformers_version} lacks")
    key_view, value_view = views[layer_idx]
    tokens = min(key_view.shape[0], value_view.shape[0])
    key_cache, value_cache = (x[:tokens].unsqueeze(1) for x in (key_view, value_view))
    # Padding tokens (static shapes) past the batch's last query all point at one trash slot:
    # only the real ones are written.
    used = int(kwargs["cu_seq_lens_q"][-1])
    write = write[:used]
    new_keys, new_values = (x[0].transpose(0, 1)[:used] for x in (key_states, value_states))
    _paged.append_pages(new_keys, new_values, write.to(torch.int64), key_cache, value_cache)
    # With no past to read (prefills only), each sequence's keys are the ones just written.
    slots = read if read.numel() > 0 else write
    kwargs[_KEY] = (key_cache, value_cache, slots)
    return key_states, value_states


def _switch(self, model, auto_switch_to_flash=True):
    if model.config._attn_implementation == NAME:
        return None
    return _original_switch(self, model, auto_switch_to_flash)


def register():
    """Registers attention_forward with transformers under NAME and lets continuous batching
    run it over its cache in place (see the module's docstring). Returns NAME."""
    AttentionInterface.register(NAME, attention_forward)
    _cb_cache.PagedAttentionCache.update = _update
    _cb_api.ContinuousBatchingManager.switch_to_cb_friendly_attn = _switch
    return NAME
