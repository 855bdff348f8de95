"""Attention in float64 NumPy, written from the definitions and independent of attn's C++
reference: the oracle every Python test compares with."""

import numpy as np


def positions(len_q, len_k, bottom_right):
    """(each query's key position [Lq, 1], each key's index [1, Lk])."""
    return (np.arange(len_q)[:, None] + (len_k - len_q if bottom_right else 0),
            np.arange(len_k)[None, :])


def visible_keys(len_q, len_k, *, causal, window, bottom_right):
    """[Lq, Lk] bool: the keys causal and the window let each query see."""
    position, key = positions(len_q, len_k, bottom_right)
    visible = np.ones((len_q, len_k), bool)
    if causal:
        visible &= key <= position
    if window[0] >= 0:
        visible &= key >= position - window[0]
    if window[1] >= 0:
        visible &= key <= position + window[1]
    return visible


def _dense(q, k, v, *, mask, causal, bottom_right, scale, window, softcap, alibi_slopes, sinks):
    """q: [B, Hq, Lq, D]  k: [B, Hkv, Lk, D]  v: [B, Hkv, Lk, Dv]  mask: broadcastable to
    [B, Hq, Lq, Lk] -> out [B, Hq, Lq, Dv], lse [B, Hq, Lq], weights [B, Hq, Lq, Lk]"""
    heads_q, len_q, dim = q.shape[1], q.shape[2], q.shape[3]
    len_k = k.shape[2]
    group = heads_q // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    position, key = positions(len_q, len_k, bottom_right)
    if alibi_slopes is not None:
        s = s - np.asarray(alibi_slopes, np.float64)[None, :, None, None] * np.abs(position - key)
    visible = np.broadcast_to(visible_keys(len_q, len_k, causal=causal, window=window,
                                           bottom_right=bottom_right), s.shape).copy()
    if mask is not None:
        if mask.dtype == bool:
            visible &= mask
        else:
            s = s + mask.astype(np.float64)
    visible &= s != -np.inf
    s = np.where(visible, s, -np.inf)
    sink = np.full((1, heads_q, 1), -np.inf) if sinks is None else np.asarray(sinks, np.float64)[None, :, None]
    m = np.maximum(s.max(axis=-1, initial=-np.inf), sink)
    m_safe = np.where(np.isfinite(m), m, 0.0)  # max is subtracted only for stability
    e = np.where(visible, np.exp(s - m_safe[..., None]), 0.0)
    total = e.sum(axis=-1) + np.exp(sink - m_safe)
    weights = e / np.where(total > 0, total, 1.0)[..., None]
    out = weights @ v
    lse = np.where(total > 0, m_safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    return out, lse, weights


def attention(q, k, v, *, mask=None, causal=False, bottom_right=False, scale=None,
              window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
              cu_seqlens_q=None, cu_seqlens_k=None):
    """The same contract as attn.attention on 4-D [B, H, S, D] float64 arrays (bhsd)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    options = dict(causal=causal, bottom_right=bottom_right, scale=scale, window=window,
                   softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)
    if cu_seqlens_q is None:
        return _dense(q, k, v, mask=mask, **options)
    batch, heads_q, total_q, _ = q.shape
    total_k = k.shape[2]
    out = np.zeros((batch, heads_q, total_q, v.shape[3]))
    lse = np.full((batch, heads_q, total_q), -np.inf)
    weights = np.zeros((batch, heads_q, total_q, total_k))
    for s in range(len(cu_seqlens_q) - 1):
        qs = slice(cu_seqlens_q[s], cu_seqlens_q[s + 1])
        ks = slice(cu_seqlens_k[s], cu_seqlens_k[s + 1])
        o, l, w = _dense(q[:, :, qs], k[:, :, ks], v[:, :, ks], mask=None, **options)
        out[:, :, qs], lse[:, :, qs], weights[:, :, qs, ks] = o, l, w
    return out, lse, weights


def scores(q, k, kind="scaled_dot", scale=None, weight=None, query_projection=None,
           key_projection=None, energy=None):
    """q: [..., Hq, Lq, Dq]  k: [..., Hkv, Lk, Dk] -> [..., Hq, Lq, Lk]"""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if q.ndim >= 3:
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
    if kind == "dot":
        return q @ np.swapaxes(k, -1, -2)
    if kind == "scaled_dot":
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        return (q @ np.swapaxes(k, -1, -2)) * scale
    if kind == "general":
        return q @ np.asarray(weight, np.float64) @ np.swapaxes(k, -1, -2)
    projected_q = q @ np.asarray(query_projection, np.float64).T  # [..., Lq, A]
    projected_k = k @ np.asarray(key_projection, np.float64).T  # [..., Lk, A]
    hidden = np.tanh(projected_q[..., :, None, :] + projected_k[..., None, :, :])
    return hidden @ np.asarray(energy, np.float64)


def softmax(s):
    """s: [..., Lk] -> weights over the last axis; an all -inf row gives zeros."""
    s = np.asarray(s, np.float64)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def context(weights, v):
    """weights: [..., Hq, Lq, Lk]  v: [..., Hkv, Lk, Dv] -> [..., Hq, Lq, Dv]"""
    weights, v = np.asarray(weights, np.float64), np.asarray(v, np.float64)
    if v.ndim >= 3:
        v = np.repeat(v, weights.shape[-3] // v.shape[-3], axis=-3)
    return weights @ v
