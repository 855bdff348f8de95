"""attn.viz: heatmaps (SVG parsed as XML, PNG by its header) and the HTML page, drawn from
the weights attn.attention returns; bad arguments raise naming the argument and leave no
file behind."""

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
