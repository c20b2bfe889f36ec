"""A corrupt model file is one line naming the fix, not a traceback from deep inside the loader (a truncated
checkpoint or a hand-edited manifest once ended every pytest run, unit tests included, in an INTERNALERROR)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.core.errors import SuiteError
from harness.engine import models as hm


@pytest.fixture
def tiny_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "model-files-test"
    shutil.copytree(hm.MODELS / "tiny-gpt-oss", folder)
    return folder


def _one_line_error(folder: Path) -> str:
    with pytest.raises(SuiteError) as e:
        hm.resolve_model(str(folder), folder.parent)
    message = str(e.value)
    assert "\n" not in message and "cannot be read" in message and "fix or replace that checkpoint" in message, message
    return message


def test_a_truncated_manifest_names_the_model(tiny_copy: Path):
    (tiny_copy / hm.MANIFEST).write_text('{"format": "compact-gpt-oss/1", ')
    assert "JSONDecodeError" in _one_line_error(tiny_copy)


def test_a_manifest_without_its_weights_list(tiny_copy: Path):
    (tiny_copy / hm.MANIFEST).write_text('{"format": "compact-gpt-oss/1", "vocab_map": "compact_vocab.json"}')
    assert "KeyError" in _one_line_error(tiny_copy)


@pytest.mark.parametrize("text", ['["compact-gpt-oss/1"]', '{"format": "compact-gpt-oss/1", "sha256": ["x"]}'],
                         ids=["a-list", "sha256-a-list"])
def test_a_manifest_of_the_wrong_shape(tiny_copy: Path, text: str):
    """A list where the object belongs was an AttributeError traceback (`.get` of a list)."""
    (tiny_copy / hm.MANIFEST).write_text(text)
    assert "TypeError" in _one_line_error(tiny_copy)


@pytest.mark.parametrize("size", [4, 100], ids=["shorter-than-its-header-length", "header-cut"])
def test_a_truncated_safetensors_file(tiny_copy: Path, size: int):
    weights = tiny_copy / "model.compact.safetensors"
    weights.write_bytes(weights.read_bytes()[:size])
    _one_line_error(tiny_copy)


def test_an_intact_copy_still_resolves(tiny_copy: Path):
    """A/A: the wrapper changes nothing for good files."""
    model = hm.resolve_model(str(tiny_copy), tiny_copy.parent)
    try:
        assert Path(model.path, "model.safetensors").is_file()
    finally:
        shutil.rmtree(model.path, ignore_errors=True)  # the shared cache keeps no copy of this test's model


@pytest.mark.parametrize("text, problem", [('{"model_type": "gpt_oss",', "is not valid JSON ("),
                                           ('["gpt_oss"]', "holds a JSON list, not an object")],
                         ids=["invalid-json", "a-list"])
@pytest.mark.parametrize("kind", ["checkpoint", "compact"])
def test_a_corrupt_config_json_of_a_model_folder_is_one_line_before_any_boot(tmp_path: Path, tiny_copy: Path,
                                                                            kind: str, text: str, problem: str):
    """vLLM reads a --model folder's config.json only once its server boots: a plain checkpoint's corrupt one was a dead
    server minutes in, a compact one's a line that named no file. Suite.create names the file now."""
    from harness.session.suite import Suite

    folder = tiny_copy if kind == "compact" else tmp_path / "my-ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(text)
    with pytest.raises(SuiteError) as e:
        Suite.create(None, str(folder), None, None, str(tmp_path / "run"), 60)
    message = str(e.value)
    assert message.startswith(f"--model {folder}: {folder / 'config.json'} {problem}"), message
    assert message.endswith("; fix or replace that checkpoint's config.json") and "\n" not in message, message


def test_a_model_path_that_is_a_file_is_named_a_file_not_a_folder_without_config_json(tmp_path: Path):
    """It said "no config.json in that directory" of a file."""
    from harness.session.suite import Suite

    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(SuiteError) as e:
        Suite.create(None, str(tmp_path / "model.safetensors"), None, None, str(tmp_path / "run"), 60)
    assert str(e.value).startswith(f"--model {tmp_path / 'model.safetensors'}: a file, not a checkpoint directory; "
                                   "pass the folder that holds its config.json"), str(e.value)
