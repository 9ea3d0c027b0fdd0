"""Which TransformerLens line is installed, and what the toolkit does on each (tl_line).

The installed version is replaced by hand-picked strings, so both lines' rules are checked on
whichever line this test runs on."""

import pytest
from transformers import LlamaConfig

from inactive_heads.core.errors import UserError
from inactive_heads.models import tl_line
from inactive_heads.models.loading import ModelLoadError, choose_backend


@pytest.fixture
def installed(monkeypatch):
    def set_version(version):
        monkeypatch.setattr(tl_line, "installed_version", lambda: version)

    return set_version


@pytest.mark.parametrize("version, hooked, line", [
    ("3.9.0", True, "3.9"), ("3.9.1rc2", True, "3.9"), ("4.0.0", False, "4"), ("4.3.0", False, "4"),
])
def test_the_line_follows_the_major_version(installed, version, hooked, line):
    installed(version)
    assert tl_line.check_supported() == version
    assert tl_line.has_hooked_transformer() is hooked
    assert tl_line.line() == line


@pytest.mark.parametrize("version", ["3.8.1", "2.16.0", "5.0.0", "10.1"])
def test_a_version_outside_the_range_is_one_line_naming_both(installed, version):
    installed(version)
    with pytest.raises(UserError) as err:
        tl_line.check_supported()
    message = str(err.value)
    assert "\n" not in message
    assert f"transformer-lens {version} is installed" in message and ">=3.9,<5" in message


def test_a_missing_transformer_lens_is_one_line(installed):
    installed(None)
    with pytest.raises(UserError, match=r"^transformer-lens is not installed; install a supported version"):
        tl_line.check_supported()


def test_on_4_every_architecture_is_a_bridge_and_hooked_is_refused(installed):
    installed("4.3.0")
    backend, reason = choose_backend(LlamaConfig(), "auto")
    assert backend == "bridge" and "TransformerLens 4.3.0 has no HookedTransformer" in reason
    assert choose_backend(LlamaConfig(), "bridge")[0] == "bridge"
    with pytest.raises(ModelLoadError) as err:
        choose_backend(LlamaConfig(), "hooked")
    message = str(err.value)
    assert "\n" not in message and "transformer-lens 4.3.0 is installed" in message
    assert "make setup TL=3.9" in message


def test_on_3_9_a_faithful_architecture_is_hooked(installed):
    installed("3.9.0")
    assert choose_backend(LlamaConfig(), "auto")[0] == "hooked"


def test_nothing_is_a_hooked_transformer_on_4(installed):
    # On 4 the check must not even import HookedTransformer (it raises ImportError there).
    installed("4.3.0")
    assert tl_line.is_hooked_transformer(object()) is False
