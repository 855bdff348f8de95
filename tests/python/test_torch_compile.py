"""attn.scaled_dot_product_attention inside torch's tracing: the custom ops attn::sdpa and
attn::sdpa_backward pass torch.library.opcheck (schema, fake kernel, autograd registration);
torch.compile(fullgraph=True) of attention, of a training step and of a transformers model
on attn compiles without a graph break and matches eager; meta tensors get the right
shapes."""

import pytest
import torch

import attn
from attn import _torch_ops


def tensors(batch=2, heads=4, heads_kv=2, len_q=9, len_k=13, dim=16, dim_v=8, seed=0,
            dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, len_q, dim, generator=g, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, dim, generator=g, dtype=dtype),
            torch.randn(batch, heads_kv, len_k, dim_v, generator=g, dtype=dtype))


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_the_custom_ops_pass_opcheck(mask_kind, dropout_p):
    q, k, v = (x.requires_grad_() for x in tensors())
    mask = {None: None, "bool": torch.randn(9, 13) > -1.0,
            "float": torch.randn(4, 9, 13).requires_grad_()}[mask_kind]
    causal = mask_kind is None
    seed = torch.tensor(12345) if dropout_p else None
    torch.library.opcheck(_torch_ops.register(),
                          (q, k, v, mask, causal, causal, 0.3, dropout_p, seed))


def test_meta_tensors_get_the_shapes_of_sdpa():
    q, k, v = (x.to("meta") for x in tensors())
    out = attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 9, 8) and out.dtype == torch.float32


def sdpa(q, k, v, mask=None, causal=False):
    return attn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_attention_matches_eager_without_graph_breaks(backend):
    q, k, v = tensors(dtype=torch.bfloat16)

    def f(q, k, v):
        return sdpa(q * 2, k, v, causal=True).float().sum(dim=-1)

    assert torch._dynamo.explain(f)(q, k, v).graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_a_compiled_training_step_matches_eager():
    """The loss compiled whole (AOT autograd traces attn::sdpa_backward and, for the learned
    bias, attn::sdpa_mask_backward into the backward graph), its gradients against eager's
    and a float64 reference."""
    q, k, v = tensors(seed=1)
    mask = torch.randn(9, 13) * 0.5  # a learned bias, added to the scores

    def loss(q, k, v, mask):
        out = sdpa(q, k, v, mask=mask)
        return (out * out).sum()

    def gradients(fn):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, mask)]
        fn(*leaves).backward()
        return [x.grad for x in leaves]

    want = gradients(loss)
    torch._dynamo.reset()
    got = gradients(torch.compile(loss, fullgraph=True, backend="aot_eager"))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6)
    reference = [x.clone().to(torch.float64).requires_grad_() for x in (q, k, v, mask)]
    expanded = [reference[0]] + [x.repeat_interleave(2, dim=1) for x in reference[1:3]]
    out = torch.nn.functional.scaled_dot_product_attention(*expanded, attn_mask=reference[3])
    for g, w in zip(got, torch.autograd.grad((out * out).sum(), reference)):
        assert (g.double() - w).abs().max().item() < 1e-4


def test_tracing_refuses_shapes_it_cannot_serve():
    q, k, v = (x.to("meta") for x in tensors())
    with pytest.raises(ValueError, match=r"^query: expected 4 dims \[B, H, L, E\]"):
        sdpa(q[0], k[0], v[0])


def test_torch_export_records_the_op_and_its_program_matches_eager():
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return sdpa(q, k, v, causal=True)

    q, k, v = tensors(seed=2)
    program = torch.export.export(Attention(), (q, k, v))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.attn.sdpa.default in targets
    assert torch.equal(program.module()(q, k, v), Attention()(q, k, v))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_transformers_model_on_attn_matches_eager(backend):
    """A Llama-style model (GQA, a padded batch) loaded with attn_implementation="attn":
    its forward compiles whole, attn::sdpa in the graph, and gives eager's logits."""
    import transformers

    import attn.integrations.transformers as integration

    integration.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("attn")
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    padding = torch.ones_like(ids)
    padding[1, :3] = 0

    def logits(ids, padding):
        return model(input_ids=ids, attention_mask=padding, use_cache=False).logits

    eager = logits(ids, padding)
    explanation = torch._dynamo.explain(logits)(ids, padding)
    assert explanation.graph_break_count == 0
    assert any("attn.sdpa" in str(node.target) for graph in explanation.graphs
               for node in graph.graph.nodes)
    torch._dynamo.reset()
    compiled = torch.compile(logits, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(ids, padding), eager, rtol=1e-5, atol=1e-5)
