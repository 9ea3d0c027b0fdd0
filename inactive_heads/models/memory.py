"""Memory a model build needs, checked before any weight is read (docs/fullsize.md)."""

import torch

from .gguf import ModelLoadError


# Peak resident memory of a HookedTransformer build on the CPU, as a multiple of the weights'
# bytes: the Hugging Face model, the converted state dict and the HookedTransformer's own
# parameters are alive together. Measured 3.215 on TransformerLens 3.9 (Llama-3.1-8B's width,
# 2 layers, bfloat16: 5.01 GB peak over a 0.52 GB process for 1.40 GB of weights;
# docs/fullsize.md), rounded up.
HOOKED_BUILD_COPIES = 3.25


def available_memory() -> int:
    """Bytes of memory available to a new allocation (``MemAvailable`` of /proc/meminfo on Linux)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_hooked_memory(local_dir, architecture: str, dtype: torch.dtype, device) -> None:
    """Refuse, in one line and before any weight is read, a HookedTransformer build on the CPU
    that needs more memory than is available (the kernel would kill it without a message); the
    TransformerLens 4 line wraps the Hugging Face weights without a copy.

    The weights' bytes are their element count, read from the safetensors headers of
    ``local_dir`` (no weight is read), times the bytes of ``dtype``; a folder without safetensors
    is not checked."""
    if torch.device(device or "cpu").type != "cpu":
        return
    from ..core.errors import UserError
    from ..core.tensor_files import CheckpointReader

    try:
        n_elements = CheckpointReader(local_dir).n_elements()
    except UserError:
        return
    weights = n_elements * torch.empty((), dtype=dtype).element_size()
    need, free = HOOKED_BUILD_COPIES * weights, available_memory()
    if need > free:
        gb = 2**30
        raise ModelLoadError(
            f"building a HookedTransformer of {architecture} in {str(dtype).removeprefix('torch.')} "
            f"needs about {need / gb:.1f} GiB ({weights / gb:.1f} GiB of weights x {HOOKED_BUILD_COPIES:g} copies "
            f"while built) but {free / gb:.1f} GiB is available; use the TransformerLens 4 line (make setup TL=4) or "
            "backend='bridge': a TransformerBridge wraps the weights without a copy"
        )
