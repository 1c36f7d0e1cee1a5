"""YAML reading that keeps line numbers and refuses duplicate keys.

PyYAML silently keeps the last of two identical keys, so a deploy file with ``max_num_seqs`` twice would run
with a value the operator may not have meant; we reject it. The composed node tree is kept so any key path
reported later can be traced back to its line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from voxstage.config.errors import ConfigError, Issue, Loc


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                first = None  # unhashable key; the base constructor reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first defined on line {first})", key_node.start_mark
                )
            try:
                seen[key] = line
            except TypeError:
                pass
        return super().construct_mapping(node, deep=deep)


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML document and the node tree it came from (for line lookups)."""

    data: Any
    root: yaml.Node | None
    source: str

    def line_of(self, loc: Loc) -> int | None:
        """1-based line of the deepest node on ``loc`` that exists (the key's line for mapping entries)."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(part):
                        line = key_node.start_mark.line + 1
                        node = value_node
                        break
                else:
                    return line
            elif (
                isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value)
            ):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line


def parse_yaml(text: str, source: str) -> YamlDocument:
    """Parse one YAML document; syntax errors become a ``ConfigError`` naming file and line."""
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            [Issue(loc=(), message=f"invalid YAML: {what}", source=source, line=line)]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Issue(loc=(), message=f"invalid YAML: {exc}", source=source)]) from None
    finally:
        loader.dispose()
    return YamlDocument(data=data, root=root, source=source)


def read_yaml_file(path: Path) -> YamlDocument:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Issue(loc=(), message="file not found", source=source)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Issue(loc=(), message=f"cannot read file: {exc}", source=source)]) from None
    return parse_yaml(text, source)
