"""attn.viz: heatmaps (SVG parsed as XML, PNG by its header) and the HTML page, drawn from
the weights attn.attention returns; bad arguments raise naming the argument and leave no
file behind."""

import re
import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import attn
from cases import random_array

SVG = "{http://www.w3.org/2000/svg}"
WORDS = ["the", "cat", "sat", "on", "the", "mat"]


def _weights(dtype="float32", heads=2, n=6):
    rng = np.random.default_rng(3)
    q, k, v = (random_array(rng, (1, heads, n, 8), dtype) for _ in range(3))
    return attn.attention(q, k, v, causal=True, return_weights=True)[1]


def _cell_fills(path):
    root = ET.parse(path).getroot()
    cells = next(g for g in root.iter(SVG + "g") if g.get("class") == "cells")
    return [rect.get("fill") for rect in cells.iter(SVG + "rect")]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_heatmap_svg_has_one_cell_per_weight(tmp_path, dtype):
    w = _weights(dtype)
    path = tmp_path / "head1.svg"
    attn.viz.heatmap(w, path, tokens=WORDS, head=1)
    fills = _cell_fills(path)
    assert len(fills) == 36
    head = np.asarray(w, dtype=np.float64)[0, 1]
    # Causal: the cells above the diagonal are 0, the scale's darkest colour; the largest
    # weight gets the brightest.
    assert all(fills[i * 6 + j] == "#440154" for i in range(6) for j in range(i + 1, 6))
    assert fills[int(np.argmax(head))] == "#fde725"
    text = ET.tostring(ET.parse(path).getroot(), encoding="unicode")
    assert all(word in text for word in WORDS)


def test_cross_attention_labels_queries_and_keys_apart(tmp_path):
    """key_tokens: the output words down, the input words across (cross-attention)."""
    w = np.full((2, 3, 4), 0.25, np.float32)
    outputs, inputs = ["le", "chat", "noir"], ["the", "black", "cat", "."]
    attn.viz.heatmap(w, tmp_path / "cross.svg", tokens=outputs, key_tokens=inputs, head=1)
    assert len(_cell_fills(tmp_path / "cross.svg")) == 12
    text = ET.tostring(ET.parse(tmp_path / "cross.svg").getroot(), encoding="unicode")
    assert all(word in text for word in outputs + inputs)
    attn.viz.html(w, tmp_path / "cross.html", tokens=outputs, key_tokens=inputs)
    assert '"black"' in (tmp_path / "cross.html").read_text()
    with pytest.raises(attn.Error, match="^key_tokens: expected 4 tokens"):
        attn.viz.heatmap(w, tmp_path / "bad.svg", tokens=outputs, key_tokens=inputs[:3])
    with pytest.raises(attn.Error, match="^key_tokens: expected tokens too"):
        attn.viz.heatmap(w, tmp_path / "bad.svg", key_tokens=inputs)
    assert not (tmp_path / "bad.svg").exists()


def test_heatmap_downsamples_to_max_cells(tmp_path):
    w = np.full((40, 30), 1 / 30, dtype=np.float32)
    attn.viz.heatmap(w, tmp_path / "small.svg", max_cells=10, downsample="mean")
    assert len(_cell_fills(tmp_path / "small.svg")) == 10 * 10  # blocks of 4 x 3


def test_heatmap_png_and_html_page(tmp_path):
    w = _weights()
    attn.viz.heatmap(w[0], str(tmp_path / "h.png"), tokens=WORDS)
    data = (tmp_path / "h.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 6 * 20 and height > 6 * 20
    attn.viz.html(w, tmp_path / "layer.html", tokens=WORDS, title="two heads")
    page = (tmp_path / "layer.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert '"heads":2' in page and "two heads" in page and "https://" not in page


def test_bad_arguments_name_themselves_and_write_nothing(tmp_path):
    w = _weights()
    cases = [
        (dict(path=tmp_path / "x.jpg"), ValueError, "path: expected a file name ending in .svg or .png"),
        (dict(path=tmp_path / "x.html"), ValueError, "attn.viz.html"),
        (dict(path=3), TypeError, "path: expected a str"),
        (dict(tokens="the cat"), TypeError, "tokens: expected a sequence of str"),
        (dict(tokens=WORDS[:4]), ValueError, "tokens: expected 6 tokens, given 4"),
        (dict(tokens=[1, 2, 3, 4, 5, 6]), TypeError, "tokens: expected str items"),
        (dict(head=2), ValueError, "head: expected 0 .. 1"),
        (dict(head=1.0), TypeError, "head: expected an int"),
        (dict(batch=-1), ValueError, "batch: expected an int >= 0"),
        (dict(downsample="median"), ValueError, "downsample: expected 'max' or 'mean'"),
        (dict(max_cells=0), ValueError, "max_cells: expected an int >= 1"),
        (dict(weights=np.ones(5)), ValueError, "weights: expected 2 to 4 dims"),
        (dict(weights=np.ones((2, 2), dtype=bool)), TypeError, "weights: expected dtype"),
        (dict(weights=np.array([[np.nan, 1.0]])), ValueError, "weights: expected finite values"),
    ]
    for changes, error, message in cases:
        arguments = dict(weights=w, path=tmp_path / "x.svg", **{})
        arguments.update(changes)
        with pytest.raises(error, match=message.replace(".", r"\.").replace("(", r"\(")):
            attn.viz.heatmap(arguments.pop("weights"), arguments.pop("path"), **arguments)
    with pytest.raises(ValueError, match="expected a file name ending in .html or .htm"):
        attn.viz.html(w, tmp_path / "x.svg")
    assert list(tmp_path.iterdir()) == []


def _blend_cells(path):
    """{class: [(row, col, value)]} of the blend's cells, each with its exact number."""
    cells = {}
    for rect in ET.parse(path).getroot().iter(SVG + "rect"):
        if rect.get("data-value") is not None:
            cells.setdefault(rect.get("class"), []).append(
                (int(rect.get("data-row")), int(rect.get("data-col", "0")),
                 float(rect.get("data-value"))))
    return cells


def _attention_with_weights(n_k, dim_v, seed):
    rng = np.random.default_rng(seed)
    q = random_array(rng, (1, 2, 3, 8), "float32")
    k = random_array(rng, (1, 1, n_k, 8), "float32")
    v = random_array(rng, (1, 1, n_k, dim_v), "float32")
    context, w = attn.attention(q, k, v, return_weights=True)
    return context, w, v


def test_blend_parses_back_to_weights_values_and_the_context(tmp_path):
    context, w, v = _attention_with_weights(6, 5, 4)
    path = tmp_path / "blend.svg"
    attn.viz.blend(w, v, path, row=2, head=1, tokens=WORDS)
    cells = _blend_cells(path)
    alpha = np.asarray(w, dtype=np.float64)[0, 1, 2]
    values = np.asarray(v, dtype=np.float64)[0, 0]
    assert [value for _, _, value in cells["weight"]] == list(alpha)
    for row, col, value in cells["value"]:
        assert value == values[row, col]
    scaled = np.zeros((6, 5))
    for row, col, value in cells["scaled"]:
        scaled[row, col] = value
    np.testing.assert_allclose(scaled, alpha[:, None] * values, rtol=1e-15)
    drawn_c = np.array([value for _, _, value in cells["context"]])
    np.testing.assert_allclose(drawn_c, scaled.sum(axis=0), atol=1e-12)
    np.testing.assert_allclose(drawn_c, np.asarray(context)[0, 1, 2], rtol=1e-5, atol=1e-6)
    text = ET.tostring(ET.parse(path).getroot(), encoding="unicode")
    assert "1 cat" in text and "C = sum of the rows" in text


def test_blend_sums_the_rest_into_one_row_that_still_adds_up(tmp_path):
    context, w, v = _attention_with_weights(30, 16, 5)
    attn.viz.blend(w[0, 0], v[0, 0], tmp_path / "long.svg", top=4)
    cells = _blend_cells(tmp_path / "long.svg")
    assert len(cells["weight"]) == 5
    alpha = np.asarray(w, dtype=np.float64)[0, 0, 0]
    assert cells["weight"][-1][2] == pytest.approx(np.sort(alpha)[:-4].sum(), rel=1e-12)
    columns = np.zeros(16)
    for _, col, value in cells["scaled"]:
        columns[col] += value
    drawn_c = np.array([value for _, _, value in cells["context"]])
    np.testing.assert_allclose(columns, drawn_c, atol=1e-12)
    np.testing.assert_allclose(drawn_c, np.asarray(context)[0, 0, 0], rtol=1e-5, atol=1e-6)


def test_blend_png_and_html(tmp_path):
    _, w, v = _attention_with_weights(6, 5, 6)
    attn.viz.blend(w, v, str(tmp_path / "b.png"), row=1)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    attn.viz.blend(w, v, tmp_path / "b.html", row=1, title="one query")
    page = (tmp_path / "b.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "one query" in page


def test_blend_bad_arguments_name_themselves_and_write_nothing(tmp_path):
    _, w, v = _attention_with_weights(6, 5, 7)
    cases = [
        (dict(row=3), ValueError, "row: expected 0 .. 2"),
        (dict(row=-1), ValueError, "row: expected an int >= 0"),
        (dict(head=2), ValueError, "head: expected 0 .. 1"),
        (dict(top=0), ValueError, "top: expected an int >= 1"),
        (dict(tokens=WORDS[:4]), ValueError, "tokens: expected 6 tokens (one per input), given 4"),
        (dict(value=np.ones((5, 5), dtype=np.float32)), ValueError,
         "value: expected [B, Hkv, Lk, Dv] = [1, a divisor of 2, 6, at least 1]"),
        (dict(value=np.ones(5)), ValueError, "value: expected 2 to 4 dims"),
        (dict(weights=np.ones((3, 6))), ValueError, "weights: expected weights that sum to 1"),
        (dict(path=tmp_path / "x.gif"), ValueError, "path: expected a file name ending in .svg"),
    ]
    for changes, error, message in cases:
        arguments = dict(weights=w, value=v, path=tmp_path / "x.svg")
        arguments.update(changes)
        with pytest.raises(error, match=re.escape(message)):
            attn.viz.blend(arguments.pop("weights"), arguments.pop("value"),
                           arguments.pop("path"), **arguments)
    assert list(tmp_path.iterdir()) == []


def _model_weights(layers=3, heads=2, n=5):
    rng = np.random.default_rng(8)
    w = rng.random((layers, heads, n, n)).astype(np.float32)
    return w / w.sum(axis=-1, keepdims=True)


def test_model_page_holds_every_layer_exactly(tmp_path):
    import base64
    w = _model_weights()
    tokens = ["[CLS]", "the", "</script>", "mat", "[SEP]"]
    attn.viz.model(list(w[:, None]), tmp_path / "m.html", tokens=tokens,
                   special=[True, False, False, False, True], title="three layers")
    page = (tmp_path / "m.html").read_text()
    start = page.index('id="attn-weights">') + len('id="attn-weights">')
    stored = np.frombuffer(base64.b64decode(page[start:page.index("</script>", start)]), "<f4")
    assert np.array_equal(stored, w.ravel())
    assert "three layers" in page and "</script><" not in page.replace("</script>\n<", "")
    attn.viz.model(w, tmp_path / "same.htm")  # one [layers, H, L, L] array works as well
    assert (tmp_path / "same.htm").read_text().startswith("<!DOCTYPE html>")


def test_model_page_bad_arguments_name_themselves_and_write_nothing(tmp_path):
    w = _model_weights()
    cases = [
        (dict(path=tmp_path / "m.svg"), ValueError, "path: expected a file name ending in .html or .htm"),
        (dict(path=None), TypeError, "path: expected a str or os.PathLike"),
        (dict(weights=w[0]), ValueError, "weights: expected [layers, H, L, L] or a sequence"),
        (dict(weights=[]), ValueError, "weights: expected at least one layer"),
        (dict(weights=[w[0], w[1, :, :4, :4]]), ValueError,
         "weights[1]: expected the shape of weights[0], (2, 5, 5), given (2, 4, 4)"),
        (dict(weights=[np.stack([w[0], w[1]])]), ValueError,
         "weights[0]: expected [H, L, L] or [1, H, L, L] (one text)"),
        (dict(weights=w[:, :, :4]), ValueError, "weights: expected [layers, heads, L, L]"),
        (dict(tokens=["a"] * 4), ValueError, "tokens: expected 5 tokens (one per position), given 4"),
        (dict(special=[True] * 4), ValueError, "special: expected 5 flags (one per token), given 4"),
        (dict(special=[1, 0, 0, 0, 1]), TypeError, "special: expected bool items, given int at 0"),
        (dict(title=3), TypeError, "title: expected a str or None"),
    ]
    for changes, error, message in cases:
        arguments = dict(weights=w, path=tmp_path / "m.html")
        arguments.update(changes)
        with pytest.raises(error, match=re.escape(message)):
            attn.viz.model(arguments.pop("weights"), arguments.pop("path"), **arguments)
    with pytest.raises(ValueError, match="cannot create"):
        attn.viz.model(w, tmp_path / "no" / "such" / "m.html")
    assert list(tmp_path.iterdir()) == []


def test_steps_page_has_every_steps_blend_of_every_head(tmp_path):
    """attn.viz.steps: a step per output row, each head's blend of the inputs' values by
    that row's weights; the page is written whole, and bad tokens are named."""
    rng = np.random.default_rng(0)
    e = np.exp(rng.standard_normal((2, 3, 4)))
    w = (e / e.sum(-1, keepdims=True)).astype(np.float32)  # [H, steps, Lk]
    v = rng.standard_normal((1, 4, 5)).astype(np.float32)  # one KV head for both
    outputs, inputs = ["le", "chat", "noir"], ["the", "black", "cat", "."]
    path = tmp_path / "steps.html"
    attn.viz.steps(w, v, path, tokens=outputs, key_tokens=inputs)
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for t, word in enumerate(outputs):
        assert f'step {t}: &quot;{word}&quot;' in page or f'step {t}: "{word}"' in page
        for h in range(2):
            assert f"head {h}: C = sum_i alpha_i v_i" in page
    weights_shown = [float(x) for x in re.findall(r'class="weight"[^>]*data-value="([^"]+)"',
                                                 page)]
    assert len(weights_shown) == 3 * 2 * 4
    np.testing.assert_allclose(sorted(weights_shown), sorted(w.ravel()), rtol=1e-6)
    with pytest.raises(attn.Error, match="^key_tokens: expected 4 tokens"):
        attn.viz.steps(w, v, tmp_path / "bad.html", tokens=outputs, key_tokens=inputs[:2])
    with pytest.raises(attn.Error, match="^tokens: expected 3 tokens"):
        attn.viz.steps(w, v, tmp_path / "bad.html", tokens=outputs[:1])
    assert not (tmp_path / "bad.html").exists()
