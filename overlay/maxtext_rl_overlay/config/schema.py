"""Every setting the tool, its scripts and its tests read besides the command
line, each once: where it lives (a key of pyproject.toml's
`[tool.maxtext-rl-overlay]`, a key of `patches/<dist>/pin.toml`, or an MRL_*
environment variable), its type and its default in words, and what it means.
The readers take their known keys from here (reader.py: the project table's
and the environment's; pins.py: the pin file's), so a key one of them reads
cannot be missing here, nor the other way round (tests/unit/test_config.py);
docs/configuration.md's tables are generated from here:

    python -m maxtext_rl_overlay.config.schema --markdown docs/configuration.md

rewrites the page's generated part in place (without the page: prints it).
Standard library only, and nothing else of the package: it is data."""

from __future__ import annotations

import dataclasses
import pathlib
import sys


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


SETTINGS = (
    # -- pyproject.toml [tool.maxtext-rl-overlay]: reader.project_options
    Setting(PYPROJECT, "revision", "integer >= 0", "required",
            "the overlay revision: every wheel's local label is `mrl.<revision>`"),
    Setting(PYPROJECT, "resolution-cutoff", "string, a UTC time written `YYYY-MM-DDTHH:MM:SSZ`", "required",
            "the package registry as of this moment is what every resolution the tool makes against it sees (uv's "
            "`--exclude-newer`): the closure `constraints.txt` pins, the build toolchain, the test matrix's tools, the TPU "
            "cell's closures; part of the closure cache's key, named in the constraints header and `verify --json`. Move it "
            "with `maxtext-rl-overlay cutoff --now` (or `--set WHEN`): [build.md](build.md#the-resolution-cutoff)"),
    Setting(PYPROJECT, "maxtext.extra", "string", "`\"maxtext\"`",
            "the extra of `[project.optional-dependencies]` that names the MaxText release (`name[extra]==version`)"),
    Setting(PYPROJECT, "maxtext.overrides-file", "string", "required", "MaxText's overrides file, a path inside its wheel"),
    Setting(PYPROJECT, "maxtext.vllm-adapter", "string", "`\"\"` (none)",
            "the release's folder holding MaxText's vLLM plugin, built into a wheel"),
    Setting(PYPROJECT, "torch.find-links", "list of strings", "`[]`",
            "where the CPU torch is published (needed unless `--torch-standin`)"),
    Setting(PYPROJECT, "matrix", "table", "required by `test-matrix`",
            "the test matrix: `cells` (each a `name`, a `python` version string such as `\"3.12\"`, an `install` marker, and "
            "tables of strings `env` and `runs`), `meshes`, `axis-types`, `k`, `dtypes`, and the table `quick` (checked by "
            "`testmatrix.load_matrix`)"),
    # -- patches/<dist>/pin.toml: pins.read_pin, pins.read_rebase_policy
    Setting(PIN, "distribution", "string", "required", "the distribution, the folder's name"),
    Setting(PIN, "import-package", "string", "required", "its top-level import package"),
    Setting(PIN, "repository", "string", "required", "the upstream's git URL"),
    Setting(PIN, "commit", "string", "required", "the pinned commit (40 hex digits)"),
    Setting(PIN, "tree", "string", "required (`\"\"`: not recorded)", "its tree id (40 hex digits)"),
    Setting(PIN, "date", "string", "required (`\"\"`: not recorded)",
            "its committer date, ISO 8601 with its UTC offset (`git log -1 --format=%cI`): the wheel's `SOURCE_DATE_EPOCH`"),
    Setting(PIN, "version", "string", "required",
            "the upstream version the wheel is built as: PEP 440, public (the build adds `+mrl.N`), in its normal form"),
    Setting(PIN, "build.env", "table of strings", "`{}`", "variables of the wheel build; `{version}` is the full wheel version"),
    Setting(PIN, "build.requirements", "table of strings", "`{}`",
            "requirement name -> replacement, each matching exactly one upstream requirement"),
    Setting(PIN, "build.requirement-files", "list of strings", "`[\"pyproject.toml\", \"requirements.txt\"]`",
            "where those requirements are"),
    Setting(PIN, "build.torch", "boolean", "`false`", "built against the closure's torch, without build isolation"),
    Setting(PIN, "rebase.version", "`\"release-tag-dev-date\"`, `\"pyproject\"` or `\"kept\"`", "`\"kept\"`",
            "how `rebase` names a new pin's version"),
    Setting(PIN, "rebase.last-known-good", "`{ file = \"...\", pin = \"...\" }`", "none",
            "a file of the upstream naming another pin's commit its CI verified"),
    # -- the tool's environment variables: reader.settings
    Setting(TOOL_ENVIRONMENT, "MRL_CACHE_DIR", "a folder", "`$XDG_CACHE_HOME/maxtext-rl-overlay`, or `~/.cache/maxtext-rl-overlay`",
            "the build cache: an absent or empty folder, or one the tool tagged with its `CACHEDIR.TAG`"),
    Setting(TOOL_ENVIRONMENT, "MRL_REFRESH", "`1` (or `true`, `yes`, `on`) or `0` (or empty, `false`, `no`, `off`)", "`0`",
            "`1`: resolve the closure afresh, whatever the cache holds (the answer is the same unless the registry changed "
            "under the cutoff: a file yanked or deleted since); `0`: reuse it"),
    Setting(TOOL_ENVIRONMENT, "MRL_PYTHON", "an interpreter", "none",
            "the interpreter for the matrix's cells (and `scripts/setup.sh`), tried before `python3.X` on PATH and pyenv's"),
    # -- the scripts', the tests' and the workflows' environment
    Setting(SCRIPT_ENVIRONMENT, "MRL_SOURCES", "`\"NAME=PATH ...\"`",
            "the repositories in `../shared/upstream` (`NAME.git`) where the checkout has them",
            "the upstream clones or mirrors holding the pins that `scripts/test-matrix.sh` builds from, and "
            "`tests/pipeline/test_real_pins.py` and the `github` rebase tests need; unset, `scripts/test.sh` and "
            "`scripts/test-matrix.sh` take the default; set empty, none (the PyPI stand-ins)"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_KILL_POINTS", "`all`", "none (CI's alone)",
            "`all`: `tests/pipeline/test_kill.py` kills a real build at every instant it names (6), not only CI's 2, and "
            "`tests/rebase/test_rebase_kill.py` a real rebase at every one of its 27, not only CI's 6"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_WORK", "a folder", "`build/test-matrix`", "the work folder of `scripts/test-matrix.sh`"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_KEEP", "`1`", "none", "`1`: `scripts/test-matrix.sh` keeps the cells' venvs"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_PLATFORM", "`cpu` or `tpu`", "none", "set by the matrix for `tests/fixes`: its platform"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_QUICK", "`1`", "none", "set by the matrix for `tests/fixes`: `1` for the quick subset"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_MAXTEXT", "any", "none", "set by the matrix's MaxText cell: MaxText is installed"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_MAXTEXT_SHIMS", "any", "none",
            "set by the MaxText cell's second run: MaxText's shims active for the whole session"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_BENCH_PYTHON", "an interpreter", "none",
            "the venv python of `scripts/bench-logprobs.sh`, `scripts/bench-decode.sh` and `scripts/bench-weight-sync.sh` "
            "(scripts/lib.sh run_bench, for the first two)"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_PYTHON311", "an interpreter", "none",
            "the Python 3.11 of `tests/unit/test_tpu_cell.py`'s host side, tried before `python3.11` on PATH and pyenv's"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_HOST_STAND_INS", "`NAME,NAME...`", "none",
            "set by the TPU cell's run.sh from `--host-stand-ins`: the host stand-ins that its `sitecustomize.py` activates in "
            "every process of a step ([tpu-cell.md](tpu-cell.md#host-stand-ins)); which are active, and what each replaces, the "
            "tool reads from that module (its `ACTIVE`), not from a variable: `smoke` accepts a host without inet sockets where "
            "`no-inet-sockets` is active, and its engine lists them"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_HOST_STAND_IN_PORT", "a port number", "29511",
            "the port `no-inet-sockets` answers for vLLM's `get_open_port`"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_PAGES_URL", "a URL", "none",
            "a repository variable of the release workflow: a custom GitHub Pages domain"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_MAXTEXT_IMAGE", "`IMAGE@sha256:<digest>`", "none (the release is not published)",
            "a repository variable of the release workflow: MaxText's post-training image, pinned by digest, that the "
            "release's image is layered onto, `verify` its gate"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_TPU_RUNNER", "a runner label", "none (the release is not published)",
            "a repository variable of the release workflow: the self-hosted TPU runner (`tpu-v6e-8`) its smoke runs on"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_IMAGE_CLOSURE", "`1`", "none",
            "`1`: `tests/pipeline/test_image.py` also runs its two closure tests (a base image of ~10 GB)"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_IMAGE_CLOSURE_BASE", "`IMAGE@sha256:<digest>`", "none (made by the test)",
            "the base image holding the closure for those tests, where one was made before"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_IMAGE_RELEASE", "a folder", "none (a release made by the test)",
            "a `scripts/build-wheels.sh` `dist/` that `tests/pipeline/test_image.py` layers onto its base image"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_TPU_CHIPS", "a number", "none",
            "set by the TPU cell for `tests/fixes`: the host's chips, counted before the suite (its process stays off them)"),
    Setting(SCRIPT_ENVIRONMENT, "MRL_TPU_CELL_STOP_AT", "seconds since 1970", "none",
            "set by the TPU cell for its pytest steps: when the step's bound ends, for its plugin (`-p cell`) to stop before a "
            "test that could not finish"),
)


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
BEGIN = "<!-- generated from overlay/maxtext_rl_overlay/config/schema.py: edit it, then run " \
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
