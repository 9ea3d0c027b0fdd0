"""Which TransformerLens line is installed, and what it offers this toolkit.

Two lines are supported: **3.9** (the last release with both ``HookedTransformer`` and
``TransformerBridge``) and **4.x** (``TransformerBridge`` only: 4.0 removed ``HookedTransformer``,
``HookedTransformerConfig``, ``transformer_lens.components`` and ``loading``).
:func:`is_hooked_transformer` never imports ``HookedTransformer`` on a line that has none; the
runtime's line adapters (:mod:`inactive_heads.runtime.lines`) use it and :func:`is_bridge`, and
everything else speaks the hook names both lines share (``blocks.{l}.attn.hook_pattern`` /
``hook_v`` / ``hook_z``) or asks its model's adapter.

This is the models stage's one line module: which backends the installed line offers, each
class's builder and the check for processed ``HookedTransformer`` weights live here, so that
``models/loading.py`` names neither class. The runtime's per-line behaviour is
:mod:`inactive_heads.runtime.lines`.
"""

import re
import shutil
import tempfile
import warnings
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import torch

from ..core.errors import UserError
from .architectures import by_class
from .gguf import ModelLoadError

# The supported range, as pyproject.toml states it: [3.9, 5).
SUPPORTED_RANGE = ">=3.9,<5"
_LOWEST = (3, 9)
_FIRST_UNSUPPORTED = (5,)
# The first release without HookedTransformer.
_BRIDGE_ONLY_FROM = (4,)


@lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed ``transformer-lens`` version string, or None if it is not installed."""
    try:
        return metadata.version("transformer-lens")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '4.3.0' -> (4, 3, 0), '3.9.0rc1' -> (3, 9, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else (0,)


def check_supported() -> str:
    """The installed version, after checking it is in the supported range (else one line)."""
    version = installed_version()
    if version is None:
        raise UserError(
            f"transformer-lens is not installed; install a supported version ({SUPPORTED_RANGE}): "
            "pip install 'transformer-lens>=3.9,<5'"
        )
    release = _release(version)
    if not (_LOWEST <= release < _FIRST_UNSUPPORTED):
        raise UserError(
            f"transformer-lens {version} is installed, but inactive-heads supports {SUPPORTED_RANGE} "
            "(3.9 and 4.x); install one of those, e.g. pip install 'transformer-lens==4.3.0'"
        )
    return version


def has_hooked_transformer() -> bool:
    """True on the 3.9 line (``HookedTransformer`` exists), False on 4.x."""
    version = installed_version()
    return version is not None and _release(version) < _BRIDGE_ONLY_FROM


def line() -> str:
    """``"3.9"`` or ``"4"``: the supported line the installed TransformerLens belongs to."""
    return "3.9" if has_hooked_transformer() else "4"


def bridge_only_choice(backend: str) -> tuple[str, str] | None:
    """On a line without ``HookedTransformer`` (4.x): ``("bridge", why)`` for ``backend`` "auto" or
    "bridge", a one-line :class:`ModelLoadError` for "hooked"; None on 3.9 (both classes exist)."""
    if has_hooked_transformer():
        return None
    version = installed_version()
    if backend == "hooked":
        raise ModelLoadError(
            f"backend='hooked' needs TransformerLens 3.9's HookedTransformer, but transformer-lens "
            f"{version} is installed (4.x has none); use backend='auto' or 'bridge', or set up the "
            "3.9 line (make setup TL=3.9)"
        )
    return "bridge", f"TransformerLens {version} has no HookedTransformer; TransformerBridge wraps the HF modules"


def what_loads() -> str:
    """The installed line, and which class a model loads as on it (one phrase, for ``models``)."""
    if has_hooked_transformer():
        return ("the 3.9 line: a HookedTransformer where it builds the architecture faithfully, "
                "else a TransformerBridge")
    return "the 4 line: every model loads as a TransformerBridge (4.0 removed HookedTransformer)"


def is_hooked_transformer(model) -> bool:
    """True for a ``HookedTransformer`` (or a subclass such as SAELens' ``HookedSAETransformer``).

    Always False on TransformerLens 4, which has no such class (nothing is imported there)."""
    if not has_hooked_transformer():
        return False
    from transformer_lens import HookedTransformer

    return isinstance(model, HookedTransformer)


def is_bridge(model) -> bool:
    """True for a ``TransformerBridge`` (both lines have one)."""
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(model, TransformerBridge)


def backend_of(model) -> str:
    """The backend name a model's ``ModelInfo`` records: ``"bridge"`` for a ``TransformerBridge``,
    else ``"hooked"``."""
    return "bridge" if is_bridge(model) else "hooked"


def processed_weights_note(model) -> str | None:
    """Why a user's own ``HookedTransformer`` has processed weights, or ``None`` if it has not.

    ``HookedTransformer.from_pretrained`` folds LayerNorm weights and value biases by default
    (``from_pretrained_no_processing`` does not); folded value biases move ``b_V`` into ``b_O``,
    so ``hook_v`` and ``hook_z`` (and every score read from them) differ from the original model's.
    """
    if not is_hooked_transformer(model):
        return None
    cfg = model.cfg
    if cfg.normalization_type in ("LNPre", "RMSPre"):
        return "its LayerNorm weights were folded (HookedTransformer.from_pretrained's default)"
    if by_class(cfg.original_architecture).value_bias and not cfg.attn_only:
        b_v = [getattr(block.attn, "_b_V", None) for block in model.blocks]
        b_v = [b if b is not None else block.attn.b_V for b, block in zip(b_v, model.blocks, strict=True)]
        if all(torch.count_nonzero(b) == 0 for b in b_v):
            return "its value biases were folded into b_O"
    return None


# ----------------------------------------------------------------------------------------------
# Building each class from a local Hugging Face directory


# Substrings of a name or path that make TransformerLens 3.9 ignore config.json (its fixed configs).
_TL_NAME_TRIGGERS = ("llama", "gemma")


def _hooked_config(local_dir: Path, official_name: str, dtype: torch.dtype, n_ctx: int | None):
    """A ``HookedTransformerConfig`` built from the directory's ``config.json`` alone.

    TransformerLens picks architecture branches by substrings of the name it is given ("llama",
    "gemma", "Llama-2-70b", …) and then uses fixed configs instead of the file; so it is given a
    copy of ``config.json`` in a temporary directory whose path names nothing.
    """
    from transformer_lens import loading

    with tempfile.TemporaryDirectory(prefix="ih-cfg-") as tmp:
        neutral = Path(tmp) / "model"
        if any(word in str(neutral).lower() for word in _TL_NAME_TRIGGERS):
            raise ModelLoadError(
                f"the temporary directory {tmp} contains one of {', '.join(_TL_NAME_TRIGGERS)}, which "
                "TransformerLens reads as a model name; set TMPDIR to a path without them"
            )
        neutral.mkdir()
        shutil.copyfile(local_dir / "config.json", neutral / "config.json")
        cfg = loading.get_pretrained_model_config(str(neutral), fold_ln=False, dtype=dtype)
    cfg.model_name = official_name.rstrip("/").split("/")[-1]
    cfg.tokenizer_name = str(local_dir)
    if n_ctx is not None:
        cfg.n_ctx = n_ctx
    return cfg


def build_hooked(local_dir: Path, official_name: str, dtype: torch.dtype, device, n_ctx, n_devices):
    """A ``HookedTransformer`` and its tokenizer from a local Hugging Face directory, weights unprocessed."""
    from transformer_lens import HookedTransformer, loading
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype)
    try:
        cfg = _hooked_config(local_dir, official_name, dtype, n_ctx)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ModelLoadError(
            f"HookedTransformer cannot build '{official_name}' from {local_dir} "
            f"({type(exc).__name__}: {reason}); try backend='bridge'"
        ) from exc
    if device is not None:
        cfg.device = device
    cfg.n_devices = n_devices
    with warnings.catch_warnings():
        # TransformerLens 3.9 deprecates HookedTransformer in favour of TransformerBridge; this
        # toolkit supports both on purpose (backend="bridge" is the forward-compatible one).
        warnings.filterwarnings(
            "ignore", message="HookedTransformer is deprecated", category=DeprecationWarning
        )
        model = HookedTransformer(cfg, tokenizer=tokenizer, default_padding_side="right")
    state_dict = loading.get_pretrained_state_dict(str(local_dir), cfg, hf_model=hf_model, dtype=dtype)
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    del hf_model
    model.eval()
    return model.to(cfg.device, print_details=False), tokenizer


def build_bridge(local_dir: Path, dtype: torch.dtype, device, n_ctx):
    """A ``TransformerBridge`` and its tokenizer over the Hugging Face modules of a local directory."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    model = TransformerBridge.boot_transformers(
        str(local_dir), dtype=dtype, device=device, tokenizer=tokenizer
    )
    if n_ctx is not None:
        model.cfg.n_ctx = n_ctx
    model.eval()
    return model, tokenizer
