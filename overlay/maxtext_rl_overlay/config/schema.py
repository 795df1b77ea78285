"""Every setting the tool, its scripts and its tests read besides the command
line, each once: where it lives (a key of pyproject.toml's
`[tool.maxtext-rl-overlay]`, a key of `patches/<dist>/pin.toml`, or an MRL_*
environment variable), its type and its default in words, and what it means.
The settings are data, resources/settings.toml, read and checked here into
SETTINGS. The readers take their known keys from here (reader.py: the
project table's and the environment's; pins.py: the pin file's), so a key
one of them reads cannot be missing here, nor the other way round
(tests/unit/test_config.py); docs/configuration.md's tables are generated
from here:

    python -m maxtext_rl_overlay.config.schema --markdown docs/configuration.md

rewrites the page's generated part in place (without the page: prints it).
Standard library only, and nothing else of the package."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import tomllib
from importlib import resources


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a group of settings lives, and the caption of its table."""
    name: str
    caption: str
    column: str  # what the table's first column names: a key or a variable


PYPROJECT = Place("pyproject", "`pyproject.toml`, `[tool.maxtext-rl-overlay]` (dotted names: its sub-tables):", "key")
PIN = Place("pin", "`patches/<dist>/pin.toml`:", "key")
TOOL_ENVIRONMENT = Place("environment", "Environment variables of the tool:", "variable")
# Listed for the docs' sake: the tool never reads them (tests/unit/test_config.py
# checks that it reads the ones above and no other).
SCRIPT_ENVIRONMENT = Place("scripts", "and of the scripts, the tests, the workflows and the TPU cell's host side (the tool's "
                           "commands do not read them):", "variable")
PLACES = (PYPROJECT, PIN, TOOL_ENVIRONMENT, SCRIPT_ENVIRONMENT)


@dataclasses.dataclass(frozen=True)
class Setting:
    place: Place
    name: str  # a key (dotted: a key of a sub-table, as `maxtext.extra`) or a variable's name
    type: str  # in words, as the docs say it (markdown)
    default: str  # in words: "required", a value, or what an unset variable means
    meaning: str  # the docs' text (markdown)


#: The settings' data: resources/settings.toml, a [[setting]] table each.
SETTINGS_FILE = "settings.toml"
_FIELDS = ("place", "name", "type", "default", "meaning")


def load(text: str, where: str) -> tuple[Setting, ...]:
    """The settings of `text` (resources/settings.toml's form), each checked:
    a known place, every field a non-empty string, no other field, no name
    twice in a place; ValueError naming `where` and the row otherwise."""
    places = {place.name: place for place in PLACES}
    rows = tomllib.loads(text).get("setting")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: expected [[setting]] tables")
    settings: list[Setting] = []
    for number, row in enumerate(rows, 1):
        fields = sorted(row) if isinstance(row, dict) else []
        if fields != sorted(_FIELDS) or not all(isinstance(row[f], str) and row[f] for f in _FIELDS):
            raise ValueError(f"{where}: setting {number}: expected the fields {', '.join(_FIELDS)}, each a non-empty string; got {row!r}")
        if row["place"] not in places:
            raise ValueError(f"{where}: setting {number} ({row['name']}): unknown place {row['place']!r}; known: {', '.join(places)}")
        setting = Setting(places[row["place"]], row["name"], row["type"], row["default"], row["meaning"])
        if any(s.place == setting.place and s.name == setting.name for s in settings):
            raise ValueError(f"{where}: setting {number}: {setting.name} is in {setting.place.name} twice")
        settings.append(setting)
    return tuple(settings)


SETTINGS = load(resources.files("maxtext_rl_overlay").joinpath("resources", SETTINGS_FILE).read_text(encoding="utf-8"),
                f"resources/{SETTINGS_FILE}")


def settings_of(place: Place) -> tuple[Setting, ...]:
    return tuple(s for s in SETTINGS if s.place == place)


def keys(place: Place, table: str = "") -> frozenset[str]:
    """The keys a reader knows in one table of `place`: the top level's
    (`table` empty; a sub-table is one of its keys) or a sub-table's."""
    names = [s.name for s in settings_of(place)]
    if not table:
        return frozenset(name.partition(".")[0] for name in names)
    return frozenset(name.removeprefix(table + ".") for name in names if name.startswith(table + "."))


def meanings(place: Place) -> dict[str, str]:
    """A place's settings by name: what each means."""
    return {s.name: s.meaning for s in settings_of(place)}


# -- docs/configuration.md ----------------------------------------------------

#: The generated part of docs/configuration.md lies between these two lines;
#: the prose around it is written by hand.
BEGIN = "<!-- generated from overlay/maxtext_rl_overlay/resources/settings.toml: edit it, then run " \
        "python -m maxtext_rl_overlay.config.schema --markdown docs/configuration.md -->"
END = "<!-- end of the generated tables -->"
REGENERATE = "python -m maxtext_rl_overlay.config.schema --markdown docs/configuration.md"


def markdown() -> str:
    """The tables, a place each, as docs/configuration.md shows them."""
    parts = []
    for place in PLACES:
        rows = [f"| {place.column} | type | default | meaning |", "|---|---|---|---|"]
        rows += [f"| `{s.name}` | {s.type} | {s.default} | {s.meaning} |" for s in settings_of(place)]
        parts.append(place.caption + "\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def with_tables(page: str, where: str) -> str:
    """`page` with its generated part (between BEGIN and END) made from the
    schema; ValueError where the markers are not there once each, in order."""
    before, begin, rest = page.partition(BEGIN + "\n")
    old, end, after = rest.partition(END + "\n")
    if not begin or not end or BEGIN in rest or END in after:
        raise ValueError(f"{where}: expected the lines {BEGIN!r} and {END!r} once each, in that order")
    return before + BEGIN + "\n\n" + markdown() + "\n" + END + "\n" + after


def main(argv: list[str]) -> int:
    if argv[:1] != ["--markdown"] or len(argv) > 2:
        print("usage: python -m maxtext_rl_overlay.config.schema --markdown [PAGE]\n"
              "  prints the tables of docs/configuration.md, or rewrites PAGE's generated part in place", file=sys.stderr)
        return 2
    if len(argv) == 1:
        sys.stdout.write(markdown())
        return 0
    page = pathlib.Path(argv[1])
    try:
        page.write_text(with_tables(page.read_text(), str(page)))
    except (OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
