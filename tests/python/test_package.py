"""The installed package: version, stubs that agree with the code, the example script."""

import ast
import inspect
import os
import pathlib
import re
import subprocess
import sys

import attn

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(attn.__file__).parent


def test_version_is_cmake_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert attn.__version__ == re.search(r"project\(attn\s+VERSION\s+([0-9.]+)", cmake).group(1)


def _stub_signatures():
    """name -> parameter names (with kinds) of the last stub definition of each function."""
    tree = ast.parse((PACKAGE / "__init__.pyi").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            a = node.args
            out[node.name] = ([p.arg for p in a.posonlyargs + a.args], [p.arg for p in a.kwonlyargs],
                              a.kwarg.arg if a.kwarg else None)
    return out


def _stub_classes():
    tree = ast.parse((PACKAGE / "__init__.pyi").read_text())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def test_stubs_are_shipped_and_match_the_functions():
    assert (PACKAGE / "py.typed").exists()
    stubs = _stub_signatures()
    names = [name for name in attn.__all__ if name != "__version__"]
    classes = [name for name in names if inspect.isclass(getattr(attn, name))]
    assert sorted(_stub_classes()) == sorted(classes)
    public = [name for name in names if name not in classes]
    assert sorted(stubs) == sorted(public)
    for name in public:
        params = inspect.signature(getattr(attn, name)).parameters.values()
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
        options = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        assert stubs[name] == (positional, keyword, options), name


def test_docstrings_give_shapes():
    for name in ("attention", "scaled_dot_product_attention", "scores", "softmax", "context"):
        doc = getattr(attn, name).__doc__
        assert "Shapes" in doc or "[" in doc, name


def test_quickstart_example_runs():
    env = dict(os.environ, PYTHONPATH="")
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "NumPy by hand matches: True" in result.stdout
