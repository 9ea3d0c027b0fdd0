"""Write a checkpoint without some heads, loadable by plain ``transformers`` and lm-eval.

Two modes (docs/pruning.md):

- ``"zeroed"``: the same architecture, with the input columns of ``o_proj`` (W_O) that belong to
  each removed head set to 0. Every tool loads it unchanged; nothing is faster.
- ``"pruned"``: the heads are physically removed: their ``q_proj`` rows (and bias) and ``o_proj``
  columns; a key/value head's ``k_proj``/``v_proj`` rows only when every query head of its group
  is removed; a layer with no head left keeps no attention (and no input norm). The folder
  carries its own modeling file (``modeling_pruned_heads.py``, named in ``config.json``'s
  ``auto_map``), so ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``
  loads it offline. Llama and Qwen2 families only.

Both equal the toolkit's :class:`~inactive_heads.StaticAblation` of the same heads: zeroing head
h at ``hook_z`` is zeroing its W_O columns, and a removed head (or a key/value head no kept query
reads) contributes nothing else.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..core.checks import check_path, head_pairs
from ..core.errors import UserError
from ..core.io import current_umask, write_text_atomic
from ..models.architectures import by_class, classes_with
from ..models.devices import resolve_dtype
from ..models.loading import architecture_of, read_hf_config, resolve_model_dir
from .static import check_heads
from ..core.tensor_files import CheckpointReader, write_checkpoint

MODES = ("zeroed", "pruned")
MODELING_FILE = "modeling_pruned_heads.py"
# architecture -> the class in modeling_pruned_heads.py
PRUNED_CLASSES = {name: by_class(name).pruned_class for name in classes_with("pruned_class")}
# Architectures whose attention has one q/k/v/o_proj per layer with heads as contiguous d_head
# slices (zeroing W_O columns is then exactly zeroing a head).
ZEROABLE = classes_with("zeroable")


def source_dir(model) -> Path:
    """The Hugging Face directory a model came from: a model from ``load_model``, a built-in
    alias, or a local directory."""
    if isinstance(model, (str, os.PathLike)):
        return resolve_model_dir(str(model), progress=False)[0]
    info = getattr(model, "inactive_heads_info", None)
    if info is not None and (Path(info.source) / "config.json").is_file():
        return Path(info.source)
    raise UserError(
        "export needs the checkpoint the model was loaded from; pass a model from ih.load_model, "
        "a built-in alias (e.g. 'smollm2-135m') or a local Hugging Face directory"
    )


def _heads_by_layer(heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> list[list[int]]:
    pairs = head_pairs(heads)
    check_heads(pairs, n_layers, n_heads)
    out: list[list[int]] = [[] for _ in range(n_layers)]
    for l, h in pairs:
        out[l].append(h)
    return out


def kept_heads(removed: list[list[int]], n_heads: int, n_kv_heads: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per layer: the query heads kept, and the key/value heads still read by a kept query head."""
    group = n_heads // n_kv_heads
    kept_q = [[h for h in range(n_heads) if h not in set(r)] for r in removed]
    kept_kv = [sorted({h // group for h in q}) for q in kept_q]
    return kept_q, kept_kv


def _rows(d_head: int, heads: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(h * d_head, (h + 1) * d_head) for h in heads]) if heads else torch.zeros(0, dtype=torch.long)


def _check_layout(config, arch: str, mode: str) -> tuple[int, int, int]:
    allowed = PRUNED_CLASSES if mode == "pruned" else ZEROABLE
    if arch not in allowed:
        what = "pruned (heads removed)" if mode == "pruned" else "zeroed"
        hint = "; mode='zeroed' covers more families" if mode == "pruned" else ""
        raise UserError(f"{arch} cannot be exported {what}; supported: {', '.join(allowed)}{hint}")
    n_heads, n_kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_heads, n_kv, d_head


def pruned_tensor(name: str, tensor: torch.Tensor, kept_q: list[list[int]], kept_kv: list[list[int]],
                  d_head: int) -> list[tuple[str, torch.Tensor]]:
    """What the pruned checkpoint holds for one tensor of the dense one (Llama/Qwen2 names): the
    tensor, its kept rows or columns, nothing (a layer with no head left keeps no attention and no
    input norm), or the ``o_proj`` bias of such a layer renamed ``o_bias``."""
    parts = name.split(".")
    if len(parts) < 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return [(name, tensor)]
    layer = int(parts[2])
    attn = f"model.layers.{layer}.self_attn."
    q, kv = kept_q[layer], kept_kv[layer]
    if not q:
        if name == attn + "o_proj.bias":
            return [(attn + "o_bias", tensor)]
        if name.startswith(attn) or name == f"model.layers.{layer}.input_layernorm.weight":
            return []
        return [(name, tensor)]
    if name == attn + "o_proj.weight":
        return [(name, tensor[:, _rows(d_head, q)].clone())]
    for proj, heads in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        if name in (attn + f"{proj}.weight", attn + f"{proj}.bias"):
            return [(name, tensor[_rows(d_head, heads)].clone())]
    return [(name, tensor)]


def pruned_state_dict(state: dict[str, torch.Tensor], removed: list[list[int]], n_heads: int, n_kv_heads: int,
                      d_head: int) -> dict[str, torch.Tensor]:
    """The weights of the pruned model from the dense model's ``state_dict`` (Llama/Qwen2 names)."""
    kept_q, kept_kv = kept_heads(removed, n_heads, n_kv_heads)
    return {new: t for name, tensor in state.items()
            for new, t in pruned_tensor(name, tensor, kept_q, kept_kv, d_head)}


def export_pruned(
    model,
    heads: Iterable[tuple[int, int]],
    out_dir: str | os.PathLike,
    *,
    mode: str = "pruned",
    dtype: torch.dtype | str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the checkpoint of ``model`` without ``heads`` to ``out_dir``; returns the folder.

    >>> hs = ih.static_heads(scores, "ahon_ln", 0.3)                             # doctest: +SKIP
    >>> ih.export_pruned(model, hs, "smollm2-pruned", mode="pruned")             # doctest: +SKIP
    >>> AutoModelForCausalLM.from_pretrained("smollm2-pruned", trust_remote_code=True)  # doctest: +SKIP

    ``model`` is a model from :func:`~inactive_heads.load_model` (its checkpoint is read again
    from where it was loaded), a built-in alias or a local Hugging Face directory. ``heads`` is a
    :class:`HeadSet` or (layer, head) pairs. ``mode`` is ``"zeroed"`` or ``"pruned"`` (module
    docstring). ``dtype`` defaults to the checkpoint's own. The tokenizer and generation config
    travel with it; ``export_info.json`` records what was removed.
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise UserError(f"unknown export mode {mode!r}; use 'zeroed' or 'pruned'")
    out = check_path(out_dir, "out_dir")
    pairs = head_pairs(heads)  # a malformed or negative head: one line before anything is read
    if dtype is not None:
        resolve_dtype(dtype)  # an unknown dtype: one line before anything is read
    src = source_dir(model)
    config = read_hf_config(src)
    arch = architecture_of(config)
    n_heads, n_kv, d_head = _check_layout(config, arch, mode)
    removed = _heads_by_layer(pairs, config.num_hidden_layers, n_heads)
    if not any(removed):
        raise UserError("no head to remove; pass at least one (layer, head)")
    if out.exists() and not out.is_dir():
        raise UserError(f"'{out}' is a file; give a folder to write the checkpoint to")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"'{out}' exists and is not empty; choose another folder or pass overwrite=True")
    # Written to a temporary folder beside out and renamed into place: a failed export leaves nothing.
    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        _export_into(tmp, src, heads=heads, mode=mode, dtype=dtype, arch=arch, removed=removed,
                     n_heads=n_heads, n_kv=n_kv, d_head=d_head)
        os.chmod(tmp, 0o777 & ~current_umask())  # as a folder made by mkdir, not mkdtemp's 0o700
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return out


def _export_into(out: Path, src: Path, *, heads, mode: str, dtype, arch: str, removed: list[list[int]],
                 n_heads: int, n_kv: int, d_head: int) -> None:
    """Write the exported checkpoint into ``out`` (an empty folder), one tensor at a time: the
    source checkpoint is read tensor by tensor and each is written once changed, so the export
    holds one tensor in memory, never a copy of the model."""
    from transformers import AutoTokenizer

    from . import modeling_pruned_heads

    reader = CheckpointReader(src)
    config = read_hf_config(src)
    target = _target_dtype(config, reader, dtype)
    config.dtype = target
    info: dict[str, Any] = {
        "mode": mode,
        "source": str(src),
        "architecture": arch,
        "removed_heads": [[l, h] for l, hs in enumerate(removed) for h in hs],
        "n_removed_query_heads": sum(len(r) for r in removed),
    }
    if hasattr(heads, "to_dict"):
        info["head_set"] = heads.to_dict()
    tied = bool(getattr(config, "tie_word_embeddings", False))

    def cast(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if tied and name == "lm_head.weight":
            return []  # the input embedding, written once
        return [(name, tensor.to(target) if tensor.is_floating_point() else tensor)]

    if mode == "zeroed":
        transform = _zeroing(cast, removed, d_head)
    else:
        kept_q, kept_kv = kept_heads(removed, n_heads, n_kv)
        transform = _pruning(cast, kept_q, kept_kv, d_head)
        info.update(_pruned_config(config, kept_q, kept_kv, n_kv, arch))
        shutil.copyfile(Path(modeling_pruned_heads.__file__), out / MODELING_FILE)
    write_checkpoint(reader, transform, out)
    _save_configs(config, src, out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    write_text_atomic(out / "export_info.json", json.dumps(info, indent=1) + "\n")


def _target_dtype(config, reader: CheckpointReader, dtype) -> torch.dtype:
    """The dtype written: the one asked for, else as ``from_pretrained(dtype="auto")`` would load
    (the config's, else the first floating tensor's)."""
    if dtype is not None:
        return resolve_dtype(dtype)
    stated = getattr(config, "dtype", None)
    if stated is not None:
        return resolve_dtype(str(stated).removeprefix("torch."))
    for name in reader.names():
        if reader.meta(name).is_floating_point():
            return reader.meta(name).dtype
    return torch.float32


def _zeroing(cast, removed: list[list[int]], d_head: int):
    """The transform that sets each removed head's ``o_proj`` input columns to zero."""
    targets = {f"model.layers.{layer}.self_attn.o_proj.weight": _rows(d_head, hs)
               for layer, hs in enumerate(removed) if hs}

    def transform(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        out = cast(name, tensor)
        if name in targets and out:
            zeroed = out[0][1].clone()  # a new tensor: one returned as it came is copied unchanged
            zeroed[:, targets[name]] = 0.0
            out = [(out[0][0], zeroed)]
        return out

    return transform


def _pruning(cast, kept_q: list[list[int]], kept_kv: list[list[int]], d_head: int):
    """The transform that keeps the kept heads' weights only (:func:`pruned_tensor`)."""
    def transform(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        return [pair for new, t in cast(name, tensor) for pair in pruned_tensor(new, t, kept_q, kept_kv, d_head)]

    return transform


def _pruned_config(config, kept_q: list[list[int]], kept_kv: list[list[int]], n_kv: int,
                   arch: str) -> dict[str, Any]:
    """Name the pruned model class and its kept heads in ``config``; returns what
    ``export_info.json`` adds about the kept heads."""
    cls_name = PRUNED_CLASSES[arch]
    config.kept_query_heads = kept_q
    config.kept_kv_heads = kept_kv
    config.num_attention_heads_per_layer = [len(q) for q in kept_q]
    config.num_key_value_heads_per_layer = [len(kv) for kv in kept_kv]
    config.architectures = [cls_name]
    config.auto_map = {"AutoModelForCausalLM": f"{Path(MODELING_FILE).stem}.{cls_name}"}
    return {"kept_query_heads": kept_q, "kept_kv_heads": kept_kv,
            "n_removed_kv_heads": sum(n_kv - len(kv) for kv in kept_kv)}


def _save_configs(config, src: Path, out: Path) -> None:
    """``config.json`` and ``generation_config.json`` (the source's, else one from the config)."""
    from transformers import GenerationConfig

    config.save_pretrained(out)
    if (src / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(src)
    else:
        generation = GenerationConfig.from_model_config(config)
    generation.save_pretrained(out)
