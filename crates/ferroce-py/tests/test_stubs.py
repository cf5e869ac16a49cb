"""The type stubs (python/ferroce/_ferroce.pyi) name only what the extension module has:
every class, function and constant at the top level, and every method and property of
each class."""

import ast
import pathlib

import ferroce._ferroce as module

STUBS = pathlib.Path(__file__).resolve().parents[1] / "python" / "ferroce" / "_ferroce.pyi"
TREE = ast.parse(STUBS.read_text())
# Names the stubs define for their own use (aliases, protocols), not the module's.
OWN = {"Buffer_", "FaultsArg", "DeviceMemory", "CudaArray"}


def top_level():
    for node in TREE.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    yield t.id, node


def test_every_stubbed_name_is_in_the_module():
    missing = [name for name, _ in top_level() if name not in OWN and not hasattr(module, name)]
    assert missing == []


def test_every_stubbed_method_is_on_its_class():
    missing = []
    for name, node in top_level():
        if not isinstance(node, ast.ClassDef) or not hasattr(module, name):
            continue
        cls = getattr(module, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            continue  # attributes set per instance
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                if not hasattr(cls, item.name):
                    missing.append(f"{name}.{item.name}")
    assert missing == []
