"""The de-quantization cache of GGUF models.

De-quantizing a GGUF takes transformers many seconds, so the first load of a GGUF writes the
de-quantized model and its tokenizer once to a per-user cache folder
(``$QGPM_HOME/models/<sha256 of the GGUF>``, default ``~/.cache/qgpm/models``) as
safetensors; later processes load that folder and never read the GGUF again. An entry is
complete only when its ``qgpm-cache.json`` manifest exists and every file it lists has the
recorded size; anything else (a crash mid-write, a truncated file) is rebuilt.
``QGPM_GGUF_CACHE=0`` turns the cache off. :mod:`qgpm.loading` asks :func:`cached_folder`
where to load a GGUF source from.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

__all__ = ["gguf_cache_dir", "cached_folder", "entry_complete", "MANIFEST"]

logger = logging.getLogger("qgpm")
MANIFEST = "qgpm-cache.json"
_BUILD_LOCK = threading.Lock()  # one de-quantization at a time in this process


def gguf_cache_dir() -> Path:
    """Where de-quantized GGUF models are cached (``$QGPM_HOME/models``)."""
    home = os.environ.get("QGPM_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "qgpm")
    return Path(home) / "models"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=32)
def _gguf_key(path: str, size: int, mtime_ns: int) -> str:
    """Cache key of a GGUF file: its sha256 prefix, hashed once per process per file version
    (the tokenizer and the model loads both ask for it)."""
    return _file_sha256(Path(path))[:32]


def entry_complete(folder: Path) -> bool:
    """True when ``folder`` holds a manifest and every file it lists, at its recorded size."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        return bool(files) and all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cached_folder(path: str, gguf_file: str | None) -> Path | None:
    """The cache folder holding the GGUF ``gguf_file`` of folder ``path`` de-quantized (built on
    first use), or ``None`` when there is no GGUF file, the cache is off, or it cannot be written
    (then the GGUF is read directly, with a warning)."""
    if not gguf_file or os.environ.get("QGPM_GGUF_CACHE", "1") == "0":
        return None
    gguf = Path(path) / gguf_file
    if not gguf.is_file():
        return None
    st = gguf.stat()
    key = _gguf_key(str(gguf.resolve()), st.st_size, st.st_mtime_ns)
    folder = gguf_cache_dir() / key
    with _BUILD_LOCK:
        if entry_complete(folder):
            return folder
        try:
            _build_entry(path, gguf_file, folder, key)
        except OSError as exc:
            logger.warning("qgpm: could not write the GGUF cache at %s (%s); reading the GGUF directly. "
                           "Set QGPM_HOME to a writable folder to load faster next time.", folder, exc)
            return None
        return folder


def _build_entry(path: str, gguf_file: str, folder: Path, key: str) -> None:
    """De-quantize ``gguf_file`` of folder ``path`` once, model and tokenizer, into ``folder``, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers' auto classes, only when building

    folder.parent.mkdir(parents=True, exist_ok=True)
    if folder.exists():  # an incomplete or corrupt entry: rebuild it
        logger.warning("qgpm: the GGUF cache entry %s is incomplete or corrupt; rebuilding it", folder)
        shutil.rmtree(folder, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    try:
        logger.info("qgpm: de-quantizing %s once into %s", gguf_file, folder)
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file)
        # The weights are plain float tensors now; drop the GGUF "quantizer" marks so that
        # transformers saves them and the cached config reads as an ordinary float model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        del model
        AutoTokenizer.from_pretrained(path, gguf_file=gguf_file).save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"gguf": Path(gguf_file).name, "sha256_prefix": key, "files": files}, indent=1))
        try:
            os.replace(tmp, folder)
        except OSError:
            if not entry_complete(folder):  # not another process finishing first: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
