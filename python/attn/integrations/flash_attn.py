"""FlashAttention's Python API (flash-attn 2's flash_attn_interface) on CPU, backed by attn.

    from attn.integrations.flash_attn import flash_attn_func, flash_attn_with_kvcache

The five functions keep flash-attn's names, argument names, defaults, shapes and return
conventions: tensors are [batch, seqlen, nheads, headdim] (packed [total, nheads, headdim]
for varlen), causal masks and windows are aligned bottom-right (query i sits at key
i + seqlen_k - seqlen_q), ALiBi adds -slope * |i + seqlen_k - seqlen_q - j| with slopes of
shape (nheads,) or (batch, nheads), and the softmax lse of a row that sees no key is +inf
(flash-attn's kernel; attn's own functions give -inf). Gradients flow through attn's backward.

flash_attn_with_kvcache reads and writes the caller's caches in place through attn's paged
kernel: a dense cache [batch_cache, seqlen_cache, nheads_k, headdim] is a pool of one page
per batch entry, a paged one [num_blocks, page_block_size, nheads_k, headdim] is read through
block_table; new k and v are appended at cache_seqlens (rotated first with rotary_cos and
rotary_sin, GPT-J style when rotary_interleaved, else NeoX), with cache_batch_idx choosing
each query's cache row and cache_leftpad (dense caches) where each row's keys start.

dropout_p > 0 drops weights in forward and backward alike, from a seed drawn from torch's
default generator (torch.manual_seed repeats it); return_attn_probs then returns the weights
with the dropped ones negated, as flash-attn's S_dmask encodes them (attn.dropout_mask gives
the mask itself). flash_attn_with_kvcache serves inference and has no dropout.

Not served (each refused with an error naming the argument): cache_leftpad with block_table
(as flash-attn), and block_table in flash_attn_varlen_func. deterministic and num_splits are
accepted and change nothing: attn gives the same bits on every run.
"""

import torch

from .._attention import attention
from .._dropout import dropout_mask
from .._errors import Error
from .._paged import append_pages, paged_attention

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _dropout(dropout_p):
    """attn's dropout keywords for flash-attn's dropout_p: a seed from torch's generator."""
    if not dropout_p:
        return {}
    return {"dropout_p": float(dropout_p),
            "dropout_seed": int(torch.randint(2**62, (), dtype=torch.int64))}


def _part(options, index):
    """The options of the index-th of several calls that make one: with dropout, a seed of
    its own, so that parts whose rows share indices do not share their dropped weights."""
    if "dropout_seed" not in options:
        return options
    return dict(options, dropout_seed=options["dropout_seed"] + index)


def _signed(probs, options):
    """flash-attn's S_dmask: the weights, negated where dropout dropped them."""
    if "dropout_seed" not in options:
        return probs
    kept = dropout_mask(tuple(probs.shape), options["dropout_p"], options["dropout_seed"])
    return torch.where(torch.from_numpy(kept), probs, -probs)


def _window(window_size):
    left, right = (int(x) for x in window_size)
    return None if (left, right) == (-1, -1) else (left, right)


def _options(softmax_scale, causal, window_size, softcap, paged=False, dropout_p=0.0):
    """attn's keywords for flash-attn's: everything placed bottom-right (as paged_attention
    always places it)."""
    options = {"causal": bool(causal), "scale": softmax_scale, **_dropout(dropout_p)}
    if not paged:
        options["causal_align"] = "bottom-right"
    window = _window(window_size)
    if window is not None:
        options["window"] = window
    if softcap:
        options["softcap"] = float(softcap)
    return options


def _flash_lse(lse):
    """flash-attn's lse convention: +inf, not -inf, for a row that sees no key."""
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def _slopes(alibi_slopes, batch, heads):
    """alibi_slopes as a list of per-batch-entry [heads] slopes (or [None]): flash-attn takes
    (nheads,) for every entry or (batch, nheads), one row per entry."""
    if alibi_slopes is None:
        return None
    slopes = torch.as_tensor(alibi_slopes, dtype=torch.float32)
    if slopes.shape == (heads,):
        return None if batch == 0 else [slopes] * batch
    if slopes.shape == (batch, heads):
        return list(slopes)
    raise Error(f"alibi_slopes: expected shape ({heads},) or ({batch}, {heads}), given "
                f"{tuple(slopes.shape)}")


def _dense(q, k, v, options, alibi, return_lse, return_probs):
    """attn.attention over [B, L, H, D] tensors, one call per batch entry when the ALiBi
    slopes differ between entries. Returns (out, lse [B, H, Lq] or None, probs or None)."""
    want_lse, want_probs = return_lse or return_probs, return_probs
    if alibi is None or all(s is alibi[0] for s in alibi):
        extra = {} if alibi is None else {"alibi_slopes": alibi[0]}
        calls = [(slice(None), dict(options, **extra))]
    else:
        calls = [(slice(b, b + 1), dict(_part(options, b), alibi_slopes=slopes))
                 for b, slopes in enumerate(alibi)]
    parts = []
    for rows, keywords in calls:
        results = attention(q[rows], k[rows], v[rows], layout="bshd", return_lse=want_lse,
                            return_weights=want_probs, **keywords)
        results = results if isinstance(results, tuple) else (results,)
        if want_probs:
            results = (*results[:2], _signed(results[2], keywords))
        parts.append(results)
    out = torch.cat([p[0] for p in parts])
    lse = _flash_lse(torch.cat([p[1] for p in parts])) if want_lse else None
    probs = torch.cat([p[2] for p in parts]) if want_probs else None
    return out, lse, probs


def _returned(out, lse, probs, return_attn_probs):
    return (out, lse, probs) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, headdim)  k, v: (batch, seqlen_k, nheads_k, headdim),
    nheads a multiple of nheads_k. Returns out (batch, seqlen_q, nheads, headdim), or with
    return_attn_probs (out, softmax_lse (batch, nheads, seqlen_q) float32, the softmax
    weights (batch, nheads, seqlen_q, seqlen_k), negated where dropout dropped them))."""
    options = _options(softmax_scale, causal, window_size, softcap, dropout_p=dropout_p)
    out, lse, probs = _dense(q, k, v, options, _slopes(alibi_slopes, q.shape[0], q.shape[2]),
                             return_attn_probs, return_attn_probs)
    return _returned(out, lse, probs, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """kv: (batch, seqlen_k, 2, nheads_k, headdim); otherwise flash_attn_func."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise Error(f"kv: expected shape (batch, seqlen_k, 2, nheads_k, headdim), given "
                    f"{tuple(kv.shape)}")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """qkv: (batch, seqlen, 3, nheads, headdim); otherwise flash_attn_func."""
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise Error(f"qkv: expected shape (batch, seqlen, 3, nheads, headdim), given "
                    f"{tuple(qkv.shape)}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q: (total_q, nheads, headdim)  k, v: (total_k, nheads_k, headdim); sequence s owns rows
    cu_seqlens_q[s]:cu_seqlens_q[s+1] of q and cu_seqlens_k[s]:cu_seqlens_k[s+1] of k and v
    (int32, batch + 1 entries). max_seqlen_q and max_seqlen_k are accepted as given (attn
    reads the lengths from the offsets). Returns out (total_q, nheads, headdim), or with
    return_attn_probs (out, softmax_lse (nheads, total_q) float32, None)."""
    if block_table is not None:
        raise Error("block_table: expected None in flash_attn_varlen_func (paged keys go "
                    "through flash_attn_with_kvcache or attn.paged_attention)")
    options = _options(softmax_scale, causal, window_size, softcap, dropout_p=dropout_p)
    starts_q = [int(x) for x in torch.as_tensor(cu_seqlens_q).tolist()]
    starts_k = [int(x) for x in torch.as_tensor(cu_seqlens_k).tolist()]
    alibi = _slopes(alibi_slopes, len(starts_q) - 1, q.shape[1])
    if alibi is None or all(s is alibi[0] for s in alibi):
        if alibi is not None:
            options["alibi_slopes"] = alibi[0]
        results = attention(q[None], k[None], v[None], layout="bshd", cu_seqlens_q=starts_q,
                            cu_seqlens_k=starts_k, return_lse=return_attn_probs, **options)
        out, lse = results if return_attn_probs else (results, None)
        out, lse = out[0], None if lse is None else _flash_lse(lse[0])
    else:
        outs, lses = [], []
        for s, slopes in enumerate(alibi):
            rows_q = slice(starts_q[s], starts_q[s + 1])
            rows_k = slice(starts_k[s], starts_k[s + 1])
            one, one_lse = _dense(q[None, rows_q], k[None, rows_k], v[None, rows_k],
                                  _part(options, s), [slopes], return_attn_probs, False)[:2]
            outs.append(one[0])
            lses.append(one_lse[0] if one_lse is not None else None)
        out = torch.cat(outs)
        lse = torch.cat(lses, dim=1) if return_attn_probs else None
    return (out, lse, None) if return_attn_probs else out


def _as_lengths(cache_seqlens, batch, name="cache_seqlens"):
    if cache_seqlens is None:
        return torch.zeros(batch, dtype=torch.int64)
    if isinstance(cache_seqlens, int):
        return torch.full((batch,), cache_seqlens, dtype=torch.int64)
    lengths = torch.as_tensor(cache_seqlens).to(torch.int64).reshape(-1)
    if lengths.shape != (batch,):
        raise Error(f"{name}: expected an int or shape ({batch},), given "
                    f"{tuple(lengths.shape)}")
    return lengths


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention of q over the caller's KV cache, with new keys and values appended in place.

    q: (batch, seqlen_q, nheads, headdim)
    k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim) without block_table, else
        (num_blocks, page_block_size, nheads_k, headdim); written in place.
    k, v: (batch, seqlen_new, nheads_k, headdim) or None: written at positions
        cache_seqlens[b] .. cache_seqlens[b] + seqlen_new of entry b's cache first.
    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2): k is rotated at its positions before
        it is stored; q at cache_seqlens + i when causal or windowed, else at cache_seqlens.
    cache_seqlens: int or (batch,) int32, the keys each cache row holds before the append.
    cache_batch_idx: (batch,) int32, the cache row of each batch entry (default: b).
    cache_leftpad: (batch,) int32, the first row of each entry's keys (default 0; rows before
        it are padding); positions for causal, windows and ALiBi count from it, rotary
        positions from row 0. Dense caches only.
    block_table: (batch, max_blocks_per_seq) int32, the pages of each entry's keys.
    Returns out (batch, seqlen_q, nheads, headdim) in q's dtype, and with return_softmax_lse
    also softmax_lse (batch, nheads, seqlen_q) float32.
    """
    batch, seqlen_q, heads, _ = q.shape
    if cache_leftpad is not None and block_table is not None:
        raise Error("cache_leftpad: expected None with block_table (as flash-attn: a paged "
                    "entry's keys start at its first page)")
    if block_table is None:
        pages = torch.arange(batch, dtype=torch.int32) if cache_batch_idx is None else \
            torch.as_tensor(cache_batch_idx).to(torch.int32).reshape(batch)
        table = pages[:, None]
        page_size = k_cache.shape[1]
    else:
        if cache_batch_idx is not None:
            raise Error("cache_batch_idx: expected None with block_table (the table chooses "
                        "each entry's pages)")
        table = torch.as_tensor(block_table).to(torch.int32)
        page_size = k_cache.shape[1]
    lengths = _as_lengths(cache_seqlens, batch)
    new = 0 if k is None else k.shape[1]
    if (k is None) != (v is None):
        raise Error("k, v: expected both or neither")
    rotary = None
    if rotary_cos is not None:
        rotary = dict(rotary="interleaved" if rotary_interleaved else "neox",
                      rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                      rotary_dims=2 * rotary_cos.shape[1])
    if new:
        positions = (lengths[:, None] + torch.arange(new)[None, :]).reshape(-1)
        rows = torch.div(positions, page_size, rounding_mode="floor")
        entry = torch.arange(batch).repeat_interleave(new)
        if (rows >= table.shape[1]).any():
            raise Error(f"k: expected room in the cache for {new} new tokens after "
                        f"cache_seqlens, given caches of {table.shape[1] * page_size} tokens")
        slots = table[entry, rows].to(torch.int64) * page_size + positions % page_size
        extra = {} if rotary is None else dict(rotary, positions=positions.to(torch.int32))
        append_pages(k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]), slots,
                     k_cache, v_cache, **extra)
    seq_lens = (lengths + new).to(torch.int32)
    if cache_leftpad is not None:
        # Entry b's keys are rows [leftpad[b], cache_seqlens[b] + new) of its cache row, read
        # as pages of one row: positions (causal, windows, ALiBi) count from leftpad[b].
        leftpad = _as_lengths(cache_leftpad, batch, "cache_leftpad")
        if (leftpad < 0).any() or (leftpad > lengths).any():
            raise Error(f"cache_leftpad: expected values from 0 to cache_seqlens, given "
                        f"{leftpad.tolist()} against {lengths.tolist()}")
        seq_lens = (seq_lens - leftpad).to(torch.int32)
        width = max(int(seq_lens.max()), 1)
        rows = table[:, :1].to(torch.int64) * page_size + leftpad[:, None]
        columns = torch.arange(width)[None, :]
        table = torch.where(columns < seq_lens[:, None], rows + columns, 0).to(torch.int32)
        k_cache, v_cache = (x.reshape(-1, 1, *x.shape[2:]) for x in (k_cache, v_cache))
    query_start = torch.arange(batch + 1, dtype=torch.int32) * seqlen_q
    options = _options(softmax_scale, causal, window_size, softcap, paged=True)
    if rotary is not None:
        local = causal or "window" in options
        offsets = torch.arange(seqlen_q) if local else torch.zeros(seqlen_q, dtype=torch.int64)
        options.update(rotary, positions=(lengths[:, None] + offsets[None, :]).reshape(-1).to(
            torch.int32))
    packed = q.reshape(batch * seqlen_q, heads, q.shape[3])
    alibi = _slopes(alibi_slopes, batch, heads)
    if alibi is None or all(s is alibi[0] for s in alibi):
        extra = {} if alibi is None else {"alibi_slopes": alibi[0]}
        out, lse = paged_attention(packed, k_cache, v_cache, table, seq_lens, query_start,
                                   return_lse=True, **options, **extra)
    else:
        outs, lses = [], []
        for b, slopes in enumerate(alibi):
            rows = slice(b * seqlen_q, (b + 1) * seqlen_q)
            one = dict(options)
            if "positions" in one:
                one["positions"] = options["positions"][rows]
            o, l = paged_attention(packed[rows], k_cache, v_cache, table[b:b + 1],
                                   seq_lens[b:b + 1], query_start[:2], return_lse=True,
                                   alibi_slopes=slopes, **one)
            outs.append(o)
            lses.append(l)
        out, lse = torch.cat(outs), torch.cat(lses)
    out = out.to(q.dtype).reshape(batch, seqlen_q, heads, -1)
    if not return_softmax_lse:
        return out
    lse = _flash_lse(lse.reshape(batch, seqlen_q, heads).permute(0, 2, 1))
    return out, lse.contiguous()
