"""The fast tier guards itself: a unit test that converts a built-in model or opens a network
connection fails with a line saying so; a missing prerequisite skips locally and fails in CI."""

import os
import socket
from pathlib import Path

import pytest
from prerequisites import require

from inactive_heads.models import gguf
from inactive_heads.models.loading import load_model


def test_the_fast_tier_runs_on_an_empty_model_cache():
    cache = Path(os.environ["INACTIVE_HEADS_CACHE"])
    assert cache != Path.home() / ".cache" / "inactive_heads"
    assert list(cache.iterdir()) == []


def test_converting_a_builtin_model_fails_the_test(monkeypatch, tmp_path):
    # As if the model's package were installed, so that loading reaches the conversion.
    fake_part = tmp_path / "model.gguf"
    fake_part.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "gguf_part_paths", lambda model: [fake_part])
    with pytest.raises(pytest.fail.Exception, match="fast-tier test converts the built-in model 'smollm2-135m'"):
        load_model("smollm2-135m", progress=False)


def test_a_network_connection_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match=r"fast-tier test opened a network connection to \('192.0.2.1', 80\)"):
        socket.create_connection(("192.0.2.1", 80), timeout=0.01)  # TEST-NET-1: never routed
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # loopback stays allowed
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        socket.create_connection(server.getsockname(), timeout=1).close()


def test_a_missing_prerequisite_skips_here_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    require(True, "never raised")
    with pytest.raises(pytest.skip.Exception, match="gemma is not installed"):
        require(False, "gemma is not installed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="missing in CI: gemma is not installed"):
        require(False, "gemma is not installed")
