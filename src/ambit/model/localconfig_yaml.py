"""The YAML side of :mod:`ambit.model.localconfig`: loading a local config file's text and writing one out.

Kept apart so that importing the local config's model (the admin ``/config_dump`` uses its dict form) does not
import PyYAML: only a process that reads or writes such a file does.
"""

from __future__ import annotations

from typing import Any

import yaml

from ambit.model.errors import LocalConfigError
from ambit.model.untrusted_yaml import SafeLoader as _BaseLoader
from ambit.model.untrusted_yaml import load as _load_untrusted

__all__ = ["dump_yaml", "load_yaml"]


class _DuplicateCheckingLoader(_BaseLoader):
    """The safe loader, refusing a scalar key given twice in one mapping (YAML says keys are unique)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=False)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> object:
    """The document in ``text``; any problem raises :class:`LocalConfigError` naming the line."""
    try:
        return _load_untrusted(text, _DuplicateCheckingLoader)  # a safe loader without aliases, see _BaseLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        raise LocalConfigError(f"YAML {where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise LocalConfigError(f"YAML: {exc}") from None
    except RecursionError:
        raise LocalConfigError("YAML: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp with month 13, a lone surrogate
        raise LocalConfigError(f"YAML: {exc}") from None


def dump_yaml(document: dict[str, Any]) -> str:
    """``document`` as block-style YAML, keys in the order given."""
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
