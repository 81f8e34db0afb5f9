"""What is derived from the schema (swarmnode.settings.config), rendered from it: `join`'s and
`doctor`'s flags (swarmnode/settings/flags.py, which the CLI reads without importing pydantic)
and the configuration reference (docs/configuration.md).

    python -m swarmnode.settings.reference          # write both (make reference)
    python -m swarmnode.settings.reference --check  # exit 1 when either is stale

A setting is described once, by its field's description; a flag is declared on its field
(`join_flag`). tests/test_settings.py fails when a rendered file differs from what is on disk.
"""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from swarmnode.settings.config import FLAG, Config

COMMAND = "python -m swarmnode.settings.reference"
REGENERATE = f"`make reference` ({COMMAND})"
FLAGS_PATH = Path(__file__).with_name("flags.py")
REFERENCE_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"  # in a checkout
MI = 1 << 20


@dataclass(frozen=True)
class Setting:
    """One leaf of the schema."""

    dotted: str  # model.lora.rank
    field: FieldInfo
    default: Any  # the value a Config() holds

    @property
    def description(self) -> str:
        if not self.field.description:
            raise ValueError(f"{self.dotted} has no description: give its field one in swarmnode/settings/config.py")
        return self.field.description

    @property
    def flag(self) -> dict[str, Any] | None:
        extra = self.field.json_schema_extra
        return extra.get(FLAG) if isinstance(extra, dict) else None

    @property
    def choices(self) -> tuple[str, ...]:
        """The names the setting takes, where they are a closed list (a Literal) or have
        examples (the built-in tasks); its description lists them as 'a | b | c'."""
        base = _base(self.field.annotation)
        if get_origin(base) is list:
            base = get_args(base)[0]
        if get_origin(base) is Literal:
            return tuple(str(arg) for arg in get_args(base))
        return tuple(str(example) for example in self.field.examples or ())


def settings(section: BaseModel | None = None, prefix: str = "") -> list[Setting]:
    """Every setting, in the schema's order, with its default."""
    section = Config() if section is None else section
    found = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            found += settings(value, f"{prefix}{name}.")
        else:
            found.append(Setting(prefix + name, field, value))
    return found


def _base(annotation: Any) -> Any:
    """X of `X | None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [arg for arg in get_args(annotation) if arg is not type(None)]
    return annotation


def value_kind(annotation: Any) -> str:
    """A flag's value as the CLI parses it: str, int, float, path or list[...] of one of those."""
    base = _base(annotation)
    if get_origin(base) is list:
        return f"list[{value_kind(get_args(base)[0])}]"
    if get_origin(base) is Literal and all(isinstance(arg, str) for arg in get_args(base)):
        return "str"
    kinds = {str: "str", int: "int", float: "float", Path: "path"}
    if base not in kinds:
        raise ValueError(f"a flag for a setting of type {annotation} is not supported")
    return kinds[base]


# -- flags.py ------------------------------------------------------------------------------------

FLAGS_HEAD = f'''"""`swarmnode join`'s flags that set a setting, and which of them `swarmnode doctor` takes.

GENERATED from the schema (swarmnode/settings/config.py) by `{COMMAND}`
(`make reference`): do not edit. A flag is declared on its setting's field there (`join_flag`),
and its help is the setting's description. Nothing here imports pydantic: the CLI reads this
module to draw `--help` at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    option: str  # --lora-rank
    setting: str  # the dotted setting it sets
    kind: str  # its value: str, int, float, path or list[...] of one of those (repeatable)
    description: str  # the setting's description, the flag's help
    short: str | None = None  # -x
    envvar: str | None = None  # an environment variable that sets it too
    doctor: bool = False  # `swarmnode doctor` takes it too


'''


def render_flags() -> str:
    lines = ["JOIN_FLAGS: dict[str, Flag] = {  # the command's parameter (the option in snake case) -> the flag, in the schema's order"]
    for setting in settings():
        spec = setting.flag
        if spec is None:
            continue
        option = spec["option"]
        named = {"option": option, "setting": setting.dotted, "kind": value_kind(setting.field.annotation),
                 "description": setting.description, **{key: spec[key] for key in ("short", "envvar") if spec.get(key)}}
        items = [f"{key}={_literal(value)}" for key, value in named.items()] + (["doctor=True"] if spec["doctor"] else [])
        lines += [f"    {_literal(option.removeprefix('--').replace('-', '_'))}: Flag(",
                  *(f"        {item}," for item in items), "    ),"]
    lines += ["}", "DOCTOR_FLAGS = {name: flag for name, flag in JOIN_FLAGS.items() if flag.doctor}", ""]
    return FLAGS_HEAD + "\n".join(lines)


def _literal(text: str) -> str:
    """A Python string literal in double quotes (JSON's escapes are Python's)."""
    return json.dumps(text, ensure_ascii=False)


# -- docs/configuration.md -----------------------------------------------------------------------

REFERENCE_HEAD = f"""<!-- GENERATED from swarmnode/settings/config.py by `{COMMAND}` (make reference): edit the descriptions there. -->
# Configuration reference

Every setting of a node, with its default and what it does.

Precedence: YAML (`--config`) < `--set section.key=value` (repeatable, YAML values) < flags.
Unknown keys and invalid values stop the node with a message naming the setting.

Without `--config`, a node starts from a preset chosen by its model, then applies `--set` and
flags: a tiny model from the tiny CPU preset (`swarmnode/settings/presets.py`, written out as
configs/tiny-cpu.yaml: lr 1e-4, 10 new tokens, 300 rounds), a real model from the paper's
GSM8K setup (`swarmnode/settings/defaults.py`). The table gives each setting's own default,
which applies wherever neither a file nor a preset names it. Each setting is described once, in
the schema (`swarmnode/settings/config.py`): this table and `join`'s flags
(`swarmnode/settings/flags.py`), the flag after a setting, are rendered from it.

| setting | default | meaning |
|---|---|---|
"""

REFERENCE_TAIL = """
What each setting does in depth: [design.md](design.md) and [security.md](security.md).
"""

_CODE_SPAN = re.compile(r"(`[^`]*`)")
_MARKDOWN = re.compile(r"([|<*])")  # a table's cell separator, an HTML tag's start, emphasis


def markdown_text(text: str) -> str:
    """Plain text as a table cell shows it: | < * escaped, code spans left as they are."""
    return "".join(part if _CODE_SPAN.fullmatch(part) else _MARKDOWN.sub(r"\\\1", part)
                   for part in _CODE_SPAN.split(text))


def meaning(setting: Setting) -> str:
    """The description as a cell: its list of choices in code, then the flag that sets it."""
    text = markdown_text(setting.description)
    if setting.choices:
        listed = " | ".join(setting.choices)
        if listed not in setting.description:
            raise ValueError(f"{setting.dotted}: its description must name its choices as {listed!r}")
        text = text.replace(markdown_text(listed), " \\| ".join(f"`{name}`" for name in setting.choices), 1)
    if setting.flag:
        text += f" (`{setting.flag['option']}`)"
    return text


def written_default(setting: Setting) -> str:
    """The default as YAML writes it; a whole number of mebibytes (bytes) as `N Mi` (`N MiB`)."""
    value = setting.default
    if isinstance(value, int) and not isinstance(value, bool) and value >= MI and value % MI == 0:
        return f"{value // MI} Mi{'B' if setting.dotted.endswith('bytes') else ''}"
    value = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()


def render_reference() -> str:
    rows = [f"| {s.dotted} | {markdown_text(written_default(s))} | {meaning(s)} |" for s in settings()]
    return REFERENCE_HEAD + "\n".join(rows) + "\n" + REFERENCE_TAIL


def rendered() -> dict[Path, str]:
    """Each derived file and what the schema says it holds."""
    return {FLAGS_PATH: render_flags(), REFERENCE_PATH: render_reference()}


def stale() -> list[Path]:
    """The derived files that differ from what the schema renders."""
    return [path for path, text in rendered().items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        behind = stale()
        for path in behind:
            print(f"{path} is stale against the schema: run {REGENERATE}", file=sys.stderr)
        return 1 if behind else 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path, text in rendered().items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
