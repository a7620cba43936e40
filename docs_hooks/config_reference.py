"""The config reference, written from the config dataclasses themselves: every key with its type, its default and
the attribute docstring under its field, so that the page says what the code does and a new field without a
docstring is a warning (an error under ``mkdocs build --strict``).

A section is a dataclass field whose type is a dataclass; a choice of a named component is a field typed
``Annotated[Base, REGISTRY]`` (or ``Annotated[dict[str, Base], REGISTRY]``), whose registry's components are listed
once each, with their own options, under "Components by name".
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from components import Range, Registry


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a class and its bases (the string right under a field), by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def registry_of(hint: Any) -> Registry | None:
    """The registry a field's ``Annotated[..., REGISTRY]`` type chooses from, if any (also where the field may be
    null: ``Annotated[..., REGISTRY] | None``)."""
    optional = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else ()
    return next((found for found in map(_own_registry, (hint, *optional)) if found is not None), None)


def _own_registry(hint: Any) -> Registry | None:
    return next((extra for extra in getattr(hint, "__metadata__", ()) if isinstance(extra, Registry)), None)


def describe_type(hint: Any) -> str:
    """A type as a reader of a YAML file needs it: ``int >= 1 | null``, ``list of str``, ```none` | `bf16```."""
    registry = _own_registry(hint)
    if registry is not None:
        return f"{registry.kind} by name" if not _is_dict(hint) else f"{registry.kind}s by name"
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        base = typing.get_args(hint)[0]
        ranges = [extra for extra in hint.__metadata__ if isinstance(extra, Range)]
        text = describe_type(base)
        return f"{text} {_bound(ranges[0].describe(base))}" if ranges else text
    if origin in (typing.Union, types.UnionType):
        return " | ".join(describe_type(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " | ".join(f"`{_yaml(arg)}`" for arg in typing.get_args(hint))
    if origin in (list, tuple):
        args = [arg for arg in typing.get_args(hint) if arg is not Ellipsis]
        return f"list of {describe_type(args[0])}" if args else "list"
    if origin is dict:
        key, value = typing.get_args(hint)
        return f"map of {describe_type(key)} to {describe_type(value)}"
    if hint is type(None):
        return "null"
    if is_section(hint):
        return "section"
    return getattr(hint, "__name__", str(hint))


def _bound(description: str) -> str:
    """``>= 1`` of ``an integer >= 1``: the range without the noun the type already says."""
    for noun in ("an integer", "a finite number", "a number"):
        if description.startswith(noun):
            return description[len(noun) :].strip()
    return description


def _is_dict(hint: Any) -> bool:
    return typing.get_origin(typing.get_args(hint)[0]) is dict


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value) if isinstance(value, (list, dict, tuple)) else repr(value)


def default_of(config_field: dataclasses.Field[Any]) -> Any:
    if config_field.default is not dataclasses.MISSING:
        return config_field.default
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return dataclasses.MISSING


def describe_default(value: Any) -> str:
    """A default as it would be written in YAML; a chosen component by its name, a section as its keys below."""
    if value is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(value):
        return f"`{value.name}`" if hasattr(value, "name") else "(below)"
    if isinstance(value, dict) and value and all(dataclasses.is_dataclass(item) for item in value.values()):
        return ", ".join(f"`{name}`" for name in value)
    if isinstance(value, list) and any(dataclasses.is_dataclass(item) for item in value):
        return f"{len(value)} items"
    return f"`{_yaml(value)}`"


@dataclass
class Row:
    key: str
    type: str
    default: str
    meaning: str


@dataclass
class Section:
    """The keys of one dataclass at one place of the config (``trainer``, ``checkpoint.model_bank[]``)."""

    key: str
    anchor: str
    doc: str = ""
    rows: list[Row] = field(default_factory=list)
    same_as: tuple[str, str] | None = None
    """The anchor and the name of the place where the same dataclass is documented already, instead of rows."""


@dataclass
class Walk:
    """What walking a config class found: its sections in order, and the registries its fields choose from."""

    sections: list[Section] = field(default_factory=list)
    registries: dict[str, Registry] = field(default_factory=dict)
    undocumented: list[str] = field(default_factory=list)
    documented: dict[type, tuple[str, str]] = field(default_factory=dict)


def registry_anchor(registry: Registry) -> str:
    return "components-" + registry.kind.lower().replace(" ", "-")


def _plural(kind: str) -> str:
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


def walk(cls: type, prefix: str, root: str, found: Walk, skip: frozenset[str] = frozenset(), owner: str = "") -> Walk:
    """Every key of ``cls`` under ``prefix``, then its nested sections; ``skip``: fields documented elsewhere.
    ``root`` starts the sections' anchors (``config``, a recipe's name), so the same key of two recipes differs;
    ``owner`` names whose keys they are (``recipe `ctr```), for a later walk that meets the same dataclass to link
    to them."""
    anchor = f"{root}.{prefix.replace('[]', '')}" if prefix else root
    if cls in found.documented:
        found.sections.append(Section(prefix, anchor, same_as=found.documented[cls]))
        return found
    owner = owner or f"`{root}`"
    found.documented[cls] = (anchor, f"`{prefix}` of {owner}" if prefix else owner)
    section = Section(prefix, anchor, class_doc(cls))
    found.sections.append(section)
    nested: list[tuple[type, str]] = []
    for key, hint, meaning, default in _fields(cls, found, skip):
        dotted = f"{prefix}.{key}" if prefix else key
        registry = registry_of(hint)
        element = _dataclass_element(hint)
        if registry is not None:
            found.registries[registry.kind] = registry
            names = ", ".join(f"`{name}`" for name in registry.names())
            meaning += f" One of: {names} ([their options](#{registry_anchor(registry)}))."
        elif element is not None:
            nested.append((element, dotted if element is hint else dotted + "[]"))
            meaning += f" Its keys: [`{nested[-1][1]}`](#{root}.{dotted.replace('[]', '')})."
        section.rows.append(Row(dotted, describe_type(hint), describe_default(default), meaning.strip()))
    for element, dotted in nested:
        walk(element, dotted, root, found, owner=owner)
    return found


def _fields(cls: type, found: Walk, skip: frozenset[str]) -> Iterator[tuple[str, Any, str, Any]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    for config_field in dataclasses.fields(cls):
        if config_field.name in skip:
            continue
        meaning = docs.get(config_field.name, "")
        if not meaning and _dataclass_element(hints[config_field.name]) is None:  # a section has its own heading
            found.undocumented.append(f"{cls.__module__}.{cls.__qualname__}.{config_field.name}")
        yield config_field.name, hints[config_field.name], _one_paragraph(meaning), default_of(config_field)


def _dataclass_element(hint: Any) -> type | None:
    """The dataclass a field's value is (a section) or holds a list of (``list[ModelBankSource]``), if any."""
    for candidate in (hint, *typing.get_args(hint)):
        base = typing.get_args(candidate)[0] if typing.get_origin(candidate) is typing.Annotated else candidate
        if is_section(base):
            return base  # type: ignore[no-any-return]
        if typing.get_origin(base) is list and is_section(typing.get_args(base)[0]):
            return typing.get_args(base)[0]  # type: ignore[no-any-return]
    return None


def is_section(hint: Any) -> bool:
    """Whether a type is a dataclass (not an instance of one, such as a ``Range`` in an ``Annotated``)."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def class_doc(cls: type) -> str:
    """A class's own docstring as one paragraph; none for the signature ``dataclass`` writes where there is none."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(f"{cls.__name__}(") else _one_paragraph(doc)


def _one_paragraph(text: str) -> str:
    """A docstring as one table cell: its lines joined, ``code`` in Markdown's single backticks."""
    return " ".join(text.split()).replace("``", "`")


def component_walks(registry: Registry, found: Walk) -> Iterator[tuple[str, str, Walk]]:
    """Each component of a registry: its name, its config class's docstring (unless it is the kind's base's), and
    the walk of its options (a nested section already documented elsewhere links there)."""
    base_doc = class_doc(registry.config_base)
    for name in registry.names():
        component = registry.get(name)
        config_class = component.config_class
        options = Walk(registries=found.registries, undocumented=found.undocumented, documented=found.documented)
        anchor = f"{registry_anchor(registry)}-{name}"
        walk(config_class, "", anchor, options, skip=frozenset({"name"}), owner=f"{registry.kind} `{name}`")
        doc = _value_doc(component.value) or class_doc(config_class)
        yield name, "" if doc == base_doc else doc, options


def _value_doc(value: Any) -> str:
    """What a component's function says of itself: ``adamw``'s and ``adam``'s share a config class."""
    return _one_paragraph(value.__doc__ or "") if inspect.isfunction(value) else ""


def render_table(section: Section) -> list[str]:
    if section.same_as is not None:
        anchor, label = section.same_as
        return [f"The same keys as {label} [there](#{anchor}).", ""]
    if not section.rows:
        return ["No options but `name`.", ""]
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for row in section.rows:
        cells = (f"`{row.key}`", row.type.replace("|", "\\|"), row.default, row.meaning.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def render_walk(found: Walk, heading: str) -> list[str]:
    lines: list[str] = []
    for section in found.sections:
        title = f"`{section.key}`" if section.key else "Top-level keys"
        lines += [f"{heading} {title} {{#{section.anchor}}}", "", *([section.doc, ""] if section.doc else [])]
        lines += render_table(section)
    return lines


def render_components(found: Walk) -> list[str]:
    """Every registry the walk met, each component with its options, in the order of the registries' kinds."""
    lines: list[str] = []
    done: set[str] = set()
    while set(found.registries) - done:  # a component's options may choose from another registry
        kind = min(set(found.registries) - done)
        done.add(kind)
        registry = found.registries[kind]
        lines += [f"### {_plural(kind[0].upper() + kind[1:])} {{#{registry_anchor(registry)}}}", ""]
        lines += [
            f"Options go beside `name` under the key that chooses the {registry.kind}. A package adds its own "
            f"through the entry-point group `{registry.entry_point_group}`.",
            "",
        ]
        for name, doc, options in component_walks(registry, found):
            first, *nested = options.sections
            lines += [f"#### `{name}` {{#{first.anchor}}}", "", *([doc, ""] if doc else []), *render_table(first)]
            for section in nested:
                lines += [f"##### `{name}`: `{section.key}` {{#{section.anchor}}}", "", *render_table(section)]
    return lines
