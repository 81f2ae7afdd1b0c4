"""The three PATCH flavours kubectl sends, as the API server answers them: the pure code of :mod:`ambit.k8s.patch`,
with its :class:`~ambit.k8s.patch.PatchError` turned into the :class:`~ambit.apiserver.errors.ApiError` of the
same code (400 a malformed patch, 413 too many JSON patch operations, 422 a patch that does not apply).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ambit.apiserver.errors import ApiError, bad_request, entity_too_large, unprocessable
from ambit.k8s import patch as _patch
from ambit.k8s.patch import MERGE_BY_VALUE, MergeKeys, clone, json_equal, json_merge_patch, merge_keys_for

__all__ = [
    "MERGE_BY_VALUE",
    "MergeKeys",
    "clone",
    "json_equal",
    "json_merge_patch",
    "json_patch",
    "merge_keys_for",
    "strategic_merge_patch",
]

_BY_CODE: dict[int, Callable[[str], ApiError]] = {400: bad_request, 413: entity_too_large, 422: unprocessable}


@contextmanager
def _as_api_error() -> Iterator[None]:
    try:
        yield
    except _patch.PatchError as exc:
        raise _BY_CODE.get(exc.code, bad_request)(exc.message) from None


def json_patch(target: Any, operations: Any) -> Any:
    """:func:`ambit.k8s.patch.json_patch`, failing with an :class:`ApiError`."""
    with _as_api_error():
        return _patch.json_patch(target, operations)


def strategic_merge_patch(target: dict[str, Any], patch: dict[str, Any], merge_keys: MergeKeys) -> dict[str, Any]:
    """:func:`ambit.k8s.patch.strategic_merge_patch`, failing with an :class:`ApiError`."""
    with _as_api_error():
        return _patch.strategic_merge_patch(target, patch, merge_keys)
