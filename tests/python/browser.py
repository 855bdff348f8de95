"""Headless Chromium for the page tests, as tests/viz_browser_test.cpp drives it: Debian's
chromium (installed by scripts/install-deps.sh; ATTN_CHROMIUM chooses another) opens a page
from disk with no network and either dumps the DOM its script built or takes a screenshot.
Its console goes to stderr, so a console message or an uncaught exception shows there."""

import ctypes
import ctypes.util
import html
import os
import re
import shutil
import subprocess

import numpy as np


def find():
    """The browser's path; a missing browser fails the test, as the set-up installs one."""
    chosen = os.environ.get("ATTN_CHROMIUM")
    if chosen:
        return chosen
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no chromium on PATH (scripts/install-deps.sh installs Debian's "
                         "chromium; ATTN_CHROMIUM=/path/to/chrome chooses another)")


def run(browser, page, fragment, mode, profile):
    """(stdout, console lines) of headless Chromium on file://page#fragment with `mode`
    (["--dump-dom"] or ["--screenshot=PATH"])."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--no-first-run", "--disable-extensions",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               "--window-size=1200,900", *mode, f"file://{os.fspath(page)}{fragment}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    return done.stdout, console


def attributes(tag):
    """{name: value} of one start tag's attributes, unescaped."""
    return {name: html.unescape(value) for name, value in re.findall(r'([\w-]+)="([^"]*)"', tag)}


def elements(dom, name, **wanted):
    """(attributes, text) of every <name> element whose attributes include `wanted`
    (underscores in keys read as dashes), in document order; text up to the next tag."""
    found = []
    for match in re.finditer(rf"<{name}\b([^>]*)>([^<]*)", dom):
        attrs = attributes(match.group(1))
        if all(attrs.get(key.replace("_", "-")) == value for key, value in wanted.items()):
            found.append((attrs, html.unescape(match.group(2))))
    return found


class _PngImage(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_void_p), ("version", ctypes.c_uint32),
                ("width", ctypes.c_uint32), ("height", ctypes.c_uint32),
                ("format", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("colormap_entries", ctypes.c_uint32), ("warning_or_error", ctypes.c_uint32),
                ("message", ctypes.c_char * 64)]


def decode_png(data):
    """A PNG file's bytes -> uint8 array [height, width, 4] (RGBA), through libpng's
    simplified API (Debian's libpng16, which the C++ side links too)."""
    library = ctypes.CDLL(ctypes.util.find_library("png16") or "libpng16.so.16")
    library.png_image_begin_read_from_memory.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                         ctypes.c_size_t]
    library.png_image_finish_read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_int32, ctypes.c_void_p]
    image = _PngImage(version=1)
    if not library.png_image_begin_read_from_memory(ctypes.byref(image), data, len(data)):
        raise AssertionError(f"not a PNG: {image.message.decode()}")
    image.format = 0x03  # PNG_FORMAT_RGBA
    pixels = np.zeros((image.height, image.width, 4), dtype=np.uint8)
    if not library.png_image_finish_read(ctypes.byref(image), None,
                                         pixels.ctypes.data_as(ctypes.c_void_p),
                                         4 * image.width, None):
        raise AssertionError(f"PNG not decoded: {image.message.decode()}")
    return pixels
