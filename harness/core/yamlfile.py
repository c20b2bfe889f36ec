"""Reading the suite's YAML data files: one line naming the file, the line and the fix on any problem."""
from __future__ import annotations

from pathlib import Path

import yaml

from harness.core.errors import SuiteError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys without a word: a second `cutlass-gemm:` in configs/features.yaml
    silently replaced the first one's criteria and gate. Every data file of the suite is a mapping whose keys name
    things once, so a repeated key is an error with its line."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden here
            continue
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (first on line {seen[key] + 1}); rename or merge one",
                key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_yaml(text: str):
    """YAML text as the suite reads its files: a repeated key is a yaml.YAMLError with its line."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_mapping(path: Path, fix: str = "fix the file", empty_ok: bool = False) -> dict:
    """The top-level mapping of `path` ({} for an empty file when `empty_ok`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SuiteError(f"{path}: cannot read ({e.strerror}); restore it from git") from None
    except UnicodeDecodeError as e:  # binary junk (a bad copy, a disk error): was a UnicodeDecodeError traceback
        raise SuiteError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); {fix}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SuiteError(f"{path}:{line}: malformed YAML ({problem}); {fix}") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level; {fix}")
    return data
