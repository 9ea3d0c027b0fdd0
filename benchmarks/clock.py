"""The benchmarks' clock: wall time that waits for a device's queued work before it is read."""

import time


def synchronizer(device):
    """What waits for ``device``'s queued work before a clock is read (nothing on the CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed(fn, rounds: int, sync=lambda: None) -> list[float]:
    """Seconds of each of ``rounds`` calls of ``fn``, each between two ``sync()`` calls."""
    out = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - start)
    return out
