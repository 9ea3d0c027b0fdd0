"""Which device and dtype a model runs on: resolved and checked before any weight is loaded.

- ``device=None`` means the first GPU when torch sees one (``"cuda"``, else ``"mps"``), otherwise
  ``"cpu"``. ``"cuda"`` alone means ``"cuda:0"``.
- ``dtype="auto"`` means the model's own dtype from its config (``torch_dtype``/``dtype``) on a
  GPU, and ``float32`` on the CPU (bf16 on a CPU is fast but not faithful enough for the numbers
  this toolkit verifies). A config without a float dtype gives ``float32``.

A device that does not exist, or a dtype that device cannot compute with, is a one-line
``ValueError`` naming the value and the fix, raised before the weights are read.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from ..core.errors import UserError, WrongTypeError

GPU_TYPES = ("cuda", "mps")
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
        raise UserError(f"unknown dtype '{dtype}'; use one of {', '.join(DTYPES)}")
    raise WrongTypeError(f"dtype must be a torch.dtype or its name, got {dtype!r}")



def _gpu_count(kind: str) -> int:
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return 1 if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else 0
    return 0


def default_device() -> str:
    """``"cuda:0"`` when torch sees a CUDA GPU, else ``"mps"`` when available, else ``"cpu"``."""
    if _gpu_count("cuda"):
        return "cuda:0"
    if _gpu_count("mps"):
        return "mps"
    return "cpu"


def resolve_device(device: str | torch.device | None, *, n_devices: int = 1) -> str:
    """A device name that exists here (``"cpu"``, ``"cuda:N"``, ``"mps"``), or a one-line error."""
    if device is None:
        device = default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if not isinstance(n_devices, int) or n_devices < 1:
        raise UserError(f"n_devices must be a positive integer, got {n_devices!r}")
    if dev.type == "cpu":
        if n_devices != 1:
            raise UserError(f"n_devices={n_devices} needs GPUs; on the CPU use n_devices=1")
        return "cpu"
    if dev.type not in GPU_TYPES:
        raise UserError(f"unsupported device {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    count = _gpu_count(dev.type)
    if count == 0:
        why = (f"this torch {torch.__version__} is a CPU-only build" if dev.type == "cuda" and torch.version.cuda is None
               else f"torch {torch.__version__} sees no {dev.type.upper()} device")
        raise UserError(f"device {str(device)!r} is not available ({why}); use --device cpu "
                         f"(or install a {dev.type.upper()} build of torch on a machine with a GPU)")
    index = 0 if dev.index is None else dev.index
    if index + n_devices > count:
        wanted = f"{dev.type}:{index}" if n_devices == 1 else f"{dev.type}:{index}..{index + n_devices - 1}"
        raise UserError(f"device {wanted} does not exist: {count} {dev.type.upper()} device(s) visible "
                         f"({dev.type}:0..{dev.type}:{count - 1}); pick one of those or lower n_devices")
    return f"{dev.type}:{index}" if dev.type == "cuda" else dev.type


def config_dtype(config: Any) -> torch.dtype | None:
    """The float dtype a Hugging Face config (object or dict) declares, or None."""
    if config is None:
        return None
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    for key in ("torch_dtype", "dtype"):
        value = get(key, None)
        name = str(value).removeprefix("torch.") if value is not None else None
        if name in DTYPES:
            return DTYPES[name]
    return None


@functools.lru_cache(maxsize=None)
def _probe(device: str, dtype: torch.dtype) -> str | None:
    """None when a matmul, softmax and norm run in ``dtype`` on ``device``; else the reason."""
    try:
        x = torch.ones((4, 4), dtype=dtype, device=device)
        y = torch.softmax(x @ x, dim=-1)
        torch.linalg.vector_norm(y.float(), dim=-1)
        torch.special.entr(y.float())
        return None
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return " ".join(str(exc).split())[:120]


def check_device_dtype(
    device: str | torch.device | None,
    dtype: torch.dtype | str | None = "auto",
    *,
    config: Any = None,
    n_devices: int = 1,
) -> tuple[str, torch.dtype]:
    """Resolve ``(device, dtype)`` and check that the device exists and can compute in the dtype.

    ``dtype`` is a torch dtype, a name (``"float32"``, ``"bf16"``, …) or ``"auto"`` (see the
    module docstring; ``config`` is the model's Hugging Face config, used only by ``"auto"``).
    """
    device = resolve_device(device, n_devices=n_devices)
    kind = device.split(":")[0]
    if dtype is None or (isinstance(dtype, str) and dtype.lower() == "auto"):
        resolved = (config_dtype(config) or torch.float32) if kind in GPU_TYPES else torch.float32
    else:
        resolved = resolve_dtype(dtype)
    name = str(resolved).removeprefix("torch.")
    if kind == "cuda" and resolved == torch.bfloat16:
        first = int(device.split(":")[1])
        for i in range(first, first + n_devices):
            cap = torch.cuda.get_device_capability(i)
            if cap < (8, 0):  # bf16 arithmetic needs Ampere (compute capability 8.0) or newer
                raise UserError(f"bfloat16 is not supported by cuda:{i} ({torch.cuda.get_device_name(i)}, compute "
                                 f"capability {cap[0]}.{cap[1]}); use --dtype float16 or --dtype float32")
    reason = _probe(device, resolved)
    if reason is not None:
        raise UserError(f"dtype {name} cannot run on device {device} ({reason}); use --dtype float32")
    return device, resolved
