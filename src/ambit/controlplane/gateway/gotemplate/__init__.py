"""The subset of Go's ``text/template`` (with the sprig and Istio functions) that Istio's gateway injection
templates are written in: ``parse`` (text to tree), ``execute`` (tree and data to text, bounded), ``funcs`` (the
functions a template may call), ``values`` (Go's truth, printing and JSON). Pure.
"""

from __future__ import annotations

from ambit.controlplane.gateway.gotemplate.execute import compile_template, execute
from ambit.controlplane.gateway.gotemplate.parse import Template, TemplateError
from ambit.controlplane.gateway.gotemplate.values import Message

__all__ = ["Message", "Template", "TemplateError", "compile_template", "execute", "render"]


def render(text: str, data: object) -> str:
    """``text`` parsed and executed with ``data``; raises :class:`TemplateError`."""
    return execute(compile_template(text), data)
