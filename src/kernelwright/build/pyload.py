"""Import generated Python/Triton source as a real module.

Triton's JIT reads a kernel's source with ``inspect.getsource``, so generated kernels must live
in real files.  :func:`load_module_from_source` writes the text under ``cache_dir`` in a file
named by the hash of the text (so identical sources share one file and one import) and imports
it with importlib.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

_LOCK = threading.Lock()
_LOADED: dict[str, ModuleType] = {}


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def _safe_name(name: str) -> str:
    name = re.sub(r"\W", "_", name) or "mod"
    return name if not name[0].isdigit() else "_" + name


def load_module_from_source(text: str, name: str, cache_dir: str | os.PathLike) -> ModuleType:
    """Write ``text`` to ``cache_dir/<name>_<hash>.py`` (once) and import it.

    Returns the module; the same text and name give the same module object on later calls.
    The module is registered in ``sys.modules`` as ``kw_gen_<name>_<hash>`` so that pickling,
    dataclasses and tracebacks work; its file stays on disk as a readable artefact.
    """
    stem = f"{_safe_name(name)}_{source_hash(text)}"
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{stem}.py"
    key = str(path.resolve())
    with _LOCK:
        mod = _LOADED.get(key)
        if mod is not None:
            return mod
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{stem}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)  # atomic: concurrent writers of the same text agree
        modname = f"kw_gen_{stem}"
        spec = importlib.util.spec_from_file_location(modname, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import generated module {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(modname, None)
            raise
        _LOADED[key] = mod
        return mod


__all__ = ["load_module_from_source", "source_hash"]
