"""The configuration reader (config/reader.py): pyproject.toml's [tool.maxtext-rl-overlay],
the pin files and the MRL_* variables are checked and typed where they are
read, with their names, types and defaults in one place (schema.py), which
docs/configuration.md's tables say."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay.config import pins, reader, schema
from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.core.errors import OverlayError
from support import ROOT


@pytest.fixture
def project(tmp_path) -> pathlib.Path:
    dest = tmp_path / "project"
    dest.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    shutil.copytree(ROOT / "patches", dest / "patches")
    return dest


def _edit(path: pathlib.Path, line: str, new: str) -> None:
    """Replace the line that starts with `line` (its key, whatever its value)."""
    text, n = re.subn(rf"(?m)^{re.escape(line)}.*$", lambda m: new.replace("{line}", m.group(0)), path.read_text(), count=1)
    assert n == 1, f"no line {line!r}... in {path}"
    path.write_text(text)


# A pin file of our own (the real ones move with every rebase).
PIN = """\
distribution = "demo"
import-package = "demo"
repository = "https://example.invalid/demo"
commit = "0123456789abcdef0123456789abcdef01234567"
tree = ""
date = ""
version = "1.0"

[build]
env = { A = "x" }
requirement-files = ["pyproject.toml"]
torch = false

[build.requirements]
"numpy" = "numpy>=2"
"""


@pytest.mark.parametrize("old, new, says", [
    ("torch = false", 'torch = "no"', "[build]: torch must be true or false, not 'no'"),
    ('env = { A = "x" }', "env = { FOO = 1 }", "[build]: env must be a table of strings (NAME = \"value\"), not FOO = 1"),
    ('requirement-files = ["pyproject.toml"]', 'requirement-files = "pyproject.toml"', "[build]: requirement-files must be a list of strings"),
    ('"numpy" = "numpy>=2"', '"numpy" = 2', "[build]: requirements must be a table of strings"),
    ('version = "1.0"', "version = 1.0", "version must be a string, not 1.0"),
    ('tree = ""', "tree = false", "tree must be a string, not False"),
    ("torch = false", "torch = false\ntroch = true", "[build]: unknown key(s) 'troch' (did you mean 'torch'?)"),
    ('version = "1.0"', 'version = "1.0"\nverison = "2.0"', "unknown key(s) 'verison' (did you mean 'version'?)"),
    ('date = ""', 'date = "last tuesday"', "date = 'last tuesday' is not an ISO 8601 date and time with its UTC offset"),
    ('date = ""', 'date = "2026-07-27T09:44:06"', "date = '2026-07-27T09:44:06' is not an ISO 8601 date and time with its UTC offset"),
    ('version = "1.0"', 'version = "1.0 final"', "version = '1.0 final' is not a PEP 440 version"),
    ('version = "1.0"', 'version = "1.0+ours"', "version = '1.0+ours' has a local label (+ours); the build adds its own (+mrl.N): write '1.0'"),
    ('version = "1.0"', 'version = "1.0-RC1"', "version = '1.0-RC1' is not in PEP 440's normal form: write '1.0rc1'"),
], ids=["torch-no", "env-int", "requirement-files-string", "requirement-int", "version-float", "tree-bool", "build-typo", "top-typo",
        "date-words", "date-no-offset", "version-not-pep440", "version-local", "version-not-normal"])
def test_pin_files_are_type_checked(tmp_path, old, new, says):
    directory = tmp_path / "demo"
    directory.mkdir()
    (directory / "series").write_text("")
    assert old in PIN
    (directory / "pin.toml").write_text(PIN.replace(old, new, 1))
    with pytest.raises(OverlayError) as raised:
        pins.read_pin(directory)
    assert str(raised.value).startswith(str(directory / "pin.toml")), raised.value
    assert says in str(raised.value)
    (directory / "pin.toml").write_text(PIN)
    good = pins.read_pin(directory)  # the file as it was is fine
    assert (good.build_env, good.needs_torch, good.requirement_files) == ({"A": "x"}, False, ("pyproject.toml",))


def test_lint_refuses_a_wrongly_typed_pin_file(project):
    pin = project / "patches" / "vllm" / "pin.toml"
    pin.write_text(re.sub(r"(?m)^torch = true$", 'torch = "no"', pin.read_text(), count=1))
    done = subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "lint", "--project", str(project)], capture_output=True, text=True)
    assert done.returncode == 3 and "torch must be true or false, not 'no'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("line, new, says", [
    ("revision = ", "{line}\nrevison = 3", "[tool.maxtext-rl-overlay]: unknown key(s) 'revison' (did you mean 'revision'?)"),
    ("overrides-file = ", "{line}\noverides-file = 'x'", "[tool.maxtext-rl-overlay.maxtext]: unknown key(s) 'overides-file' (did you mean 'overrides-file'?)"),
    ("find-links = ", "{line}\nfind_links = []", "[tool.maxtext-rl-overlay.torch]: unknown key(s) 'find_links' (did you mean 'find-links'?)"),
    ("revision = ", "revision = true", "revision must be a whole number (0 or more), not True"),
    ("revision = ", "revision = -1", "revision must be a whole number (0 or more), not -1"),
    ("resolution-cutoff = ", 'resolution-cutoff = "2026-11-30"', "resolution-cutoff: '2026-11-30' is not a time in UTC written as YYYY-MM-DDTHH:MM:SSZ"),
    ("vllm-adapter = ", "vllm-adapter = 1", "[tool.maxtext-rl-overlay.maxtext]: vllm-adapter must be a string"),
    ("find-links = ", 'find-links = "https://download.pytorch.org/whl/cpu/torch/"', "[tool.maxtext-rl-overlay.torch]: find-links must be a list of strings"),
    ("overrides-file = ", "", "[tool.maxtext-rl-overlay.maxtext] lacks the key 'overrides-file'"),
    # [project]: what the build reads and writes of it, and the extra the MaxText table names there.
    ('version = "0.1.0"', 'dynamic = ["version"]', "[project]: dynamic lists version, which the build reads and writes as static values"),
    ('version = "0.1.0"', 'version = "next"', "[project]: version = 'next' is not a PEP 440 version"),
    ("dependencies = ", 'dependencies = "packaging>=24"', "[project]: dependencies must be a list of strings, not 'packaging>=24'"),
    ("dependencies = ", 'dependencies = ["packaging >>= 24"]', "[project]: dependencies holds 'packaging >>= 24', which is not a requirement (Expected"),
    ("dependencies = ", "", "[project] lacks the key 'dependencies': the build adds the overlay builds to it"),
    ("test = ", 'test = "pytest"', "[project.optional-dependencies]: test must be a list of strings, not 'pytest'"),
    ("overrides-file = ", "{line}\nextra = 'maxtex'",
     "[tool.maxtext-rl-overlay.maxtext]: extra = 'maxtex' names no extra of [project.optional-dependencies] (did you mean 'maxtext'?); "
     "its extras: build, maxtext, test."),
    ("maxtext = [", 'maxtext = ["maxtext[tpu-post-train]>=0.2.4"]', "the 'maxtext' extra must name one MaxText release and one of its extras exactly"),
], ids=["revison", "overides-file", "find_links", "revision-bool", "revision-negative", "cutoff-a-date", "adapter-int", "find-links-string",
        "no-overrides-file",
        "version-dynamic", "version-not-pep440", "dependencies-string", "dependency-invalid", "no-dependencies",
        "extra-string", "extra-unknown", "extra-not-exact"])
def test_the_project_table_is_checked(project, line, new, says):
    _edit(project / "pyproject.toml", line, new)
    with pytest.raises(OverlayError, match=re.escape(says)) as raised:
        load_project(project)
    assert str(raised.value).startswith(str(project / "pyproject.toml")), raised.value


@pytest.mark.parametrize("pattern, new, says", [
    (r"^axis-types = .*$", "axis_types = []", "[tool.maxtext-rl-overlay.matrix]: unknown key(s) 'axis_types' (did you mean 'axis-types'?)"),
    (r"^\[tool\.maxtext-rl-overlay\.matrix\.quick\]\n(.*\n)*?(?=\[tool\.ruff\])", 'quick = "yes"\n\n',  # its tables, now a string in [matrix]
     "[tool.maxtext-rl-overlay.matrix.quick] must be a table, not 'yes'"),
    (r'^"maxtext-0\.2\.4/plain" = \[', '"maxtext-0.2.4/plane" = [',
     "[tool.maxtext-rl-overlay.matrix.quick.tests]: unknown key(s) 'maxtext-0.2.4/plane' (did you mean 'maxtext-0.2.4/plain'?)"),
    (r'^  "tests/fixes/test_platform\.py",$', '  "tests/unit/test_cli.py",',
     "[tool.maxtext-rl-overlay.matrix.quick.tests] maxtext-0.2.4/plain: tests/unit/test_cli.py is not a part of tests/fixes"),
    (r'^  \{ name = "py312".*$', '  { name = "py312", python = 3.10, install = "install" },',
     "[tool.maxtext-rl-overlay.matrix] cell 'py312': python = 3.1 is a number (TOML reads 3.10 as 3.1): write the version as a string"),
    (r'^  \{ name = "py312".*$', '  { name = "py312", python = "3", install = "install" },',
     "[tool.maxtext-rl-overlay.matrix] cell 'py312': python = '3' must be a Python version such as \"3.12\""),
    (r'^  \{ name = "py312".*$', '  { name = "py312", python = "3.12", install = "install", env = { X = 1 } },',
     "[tool.maxtext-rl-overlay.matrix] cell 'py312': env must be a table of strings (NAME = \"value\"), not X = 1"),
    (r'^  \{ name = "py312".*$', '  { name = "py312", python = "3.12", install = true },',
     "[tool.maxtext-rl-overlay.matrix] cell 'py312': install must be a string, not True"),
], ids=["typo", "quick-string", "quick-tests-unknown-run", "quick-tests-outside-the-suite", "python-number", "python-not-a-version",
        "env-int", "install-bool"])
def test_lint_checks_the_matrix_table_too(project, pattern, new, says):
    """The one part of the table that only test-matrix uses: lint reads it
    as test-matrix does, and a wrong value (which TOML may have turned into
    another: 3.10 is the number 3.1) is refused, not converted."""
    pyproject = project / "pyproject.toml"
    text, n = re.subn(pattern, lambda _: new, pyproject.read_text(), count=1, flags=re.M)
    assert n == 1, pattern
    pyproject.write_text(text)
    done = subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "lint", "--project", str(project)], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert says in done.stderr and str(pyproject) in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_project_defaults():
    opts = reader.project_options({"revision": 0, "resolution-cutoff": "2026-11-30T20:00:00Z", "maxtext": {"overrides-file": "o.txt"}},
                                   "pyproject.toml")
    assert opts == reader.ProjectOptions(0, "2026-11-30T20:00:00Z", reader.MaxTextOptions("o.txt", "maxtext", ""), reader.TorchOptions(()), {})
    real = load_project(ROOT).options
    assert isinstance(real.revision, int) and real.maxtext.extra == "maxtext" and real.torch.find_links and real.matrix["cells"]
    assert load_project(ROOT).resolution_cutoff == real.resolution_cutoff


@pytest.mark.parametrize("value", ["2026-11-30", "2026-11-30T20:00:00", "2026-11-30T20:00:00+00:00", "2026-11-30T20:00Z",
                                   "2026-11-31T20:00:00Z", "2026-11-30 20:00:00Z", ""])
def test_the_resolution_cutoff_has_one_spelling(value):
    """One time, one spelling: it is a cache key and the constraints header's words."""
    data = {"revision": 0, "resolution-cutoff": value, "maxtext": {"overrides-file": "o.txt"}}
    with pytest.raises(OverlayError, match=re.escape(f"resolution-cutoff: {value!r} is not a time in UTC written as YYYY-MM-DDTHH:MM:SSZ")):
        reader.project_options(data, "pyproject.toml")
    with pytest.raises(OverlayError, match="lacks the key 'resolution-cutoff'"):
        reader.project_options({"revision": 0, "maxtext": {"overrides-file": "o.txt"}}, "pyproject.toml")
    assert reader.cutoff_value(reader.cutoff_now(), "now")


def test_now_is_source_date_epoch_where_it_is_set(monkeypatch):
    """A rebase --maxtext replayed after a kill must move the cutoff to the
    same moment as an unkilled one: reproducible-builds' SOURCE_DATE_EPOCH
    names "now" where set."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796000000")
    assert reader.cutoff_now() == "2026-11-30T00:53:20Z"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(OverlayError, match="SOURCE_DATE_EPOCH must be whole seconds since 1970, not 'yesterday'"):
        reader.cutoff_now()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert reader.cutoff_now() > "2026-11-30T00:53:20Z"


def test_the_cutoff_command_prints_the_cutoff_and_moves_it_in_place(project):
    """`maxtext-rl-overlay cutoff`: the one command that moves it, editing
    only its line of pyproject.toml (the comments that explain it kept)."""
    def cutoff(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "cutoff", *args, "--project", str(project)],
                              capture_output=True, text=True)

    before = (project / "pyproject.toml").read_text()
    old = load_project(project).resolution_cutoff
    assert cutoff().stdout == f"resolution-cutoff: {old}\n"
    moved = cutoff("--set", "2026-12-05T12:00:00Z")
    assert moved.returncode == 0 and moved.stdout.startswith(f"resolution-cutoff: {old} -> 2026-12-05T12:00:00Z in "), moved.stderr
    assert "the build lists the pins that moved" in moved.stdout
    assert (project / "pyproject.toml").read_text() == before.replace(f'resolution-cutoff = "{old}"', 'resolution-cutoff = "2026-12-05T12:00:00Z"')
    refused = cutoff("--set", "2026-12-05")
    assert refused.returncode == 2 and "'2026-12-05' is not a time in UTC written as YYYY-MM-DDTHH:MM:SSZ" in refused.stderr
    assert load_project(project).resolution_cutoff == "2026-12-05T12:00:00Z", "a refused value changes nothing"
    assert cutoff("--now").returncode == 0 and load_project(project).resolution_cutoff > "2026-12-05T12:00:00Z"


def test_environment_defaults_and_checks(tmp_path):
    home = pathlib.Path("~/.cache/maxtext-rl-overlay").expanduser()
    assert reader.settings({}) == reader.Settings(home, False, None)
    assert reader.settings({"XDG_CACHE_HOME": str(tmp_path)}).cache_dir == tmp_path / "maxtext-rl-overlay"
    assert reader.settings({"MRL_CACHE_DIR": str(tmp_path / "c"), "XDG_CACHE_HOME": "/elsewhere"}).cache_dir == tmp_path / "c"
    for on in ("1", "true", "YES", "on"):
        assert reader.settings({"MRL_REFRESH": on}).refresh
    for off in ("", "0", "false", "no", "off"):
        assert not reader.settings({"MRL_REFRESH": off}).refresh
    assert reader.settings({"MRL_PYTHON": "/usr/bin/python3.12"}).python == "/usr/bin/python3.12"
    for name, value in (("MRL_REFRESH", "maybe"),):
        with pytest.raises(OverlayError, match=re.escape(f"{name}={value!r}: expected")):
            reader.settings({name: value})


@pytest.mark.parametrize("layers, wins", [
    ({}, "default"),
    ({"XDG_CACHE_HOME": "xdg"}, "xdg"),
    ({"XDG_CACHE_HOME": "xdg", "MRL_CACHE_DIR": "mrl"}, "mrl"),
    ({"XDG_CACHE_HOME": "xdg", "MRL_CACHE_DIR": "mrl", "given": "given"}, "given"),
], ids=["default", "xdg-over-default", "environment-over-xdg", "callers-over-environment"])
def test_the_cache_dir_takes_each_layer_over_the_one_before(tmp_path, layers, wins):
    """docs/configuration.md, "Which value wins": the default, XDG_CACHE_HOME,
    MRL_CACHE_DIR, then a caller's own folder; a step each."""
    folders = {"default": pathlib.Path("~/.cache/maxtext-rl-overlay").expanduser(), "xdg": tmp_path / "xdg" / "maxtext-rl-overlay",
               "mrl": tmp_path / "mrl", "given": tmp_path / "given"}
    environ = {name: str(tmp_path / value) for name, value in layers.items() if name != "given"}
    given = folders["given"] if "given" in layers else None
    assert reader.cache_dir(given, environ) == folders[wins]
    if given is None:
        assert reader.settings(environ).cache_dir == folders[wins], "settings() reads the same"


def test_the_checkout_is_the_one_holding_the_current_folder_unless_project_names_one(project, tmp_path):
    """docs/configuration.md, "Which value wins": the checkout above the
    current folder, then --project over it; outside a checkout, without
    --project, a refusal that names the option."""
    inside = project / "patches" / "vllm"
    assert reader.project_root(None, inside) == project
    assert reader.project_root(tmp_path / "elsewhere", inside) == tmp_path / "elsewhere"
    with pytest.raises(OverlayError, match="pass --project"):
        reader.project_root(None, tmp_path)


def test_every_mrl_variable_of_the_tool_is_read_in_the_reader_only():
    reads = re.compile(r"""\b(?:environ|env)(?:\.get)?\s*[\[(]\s*["'](MRL_\w+)""")
    package = ROOT / "overlay" / "maxtext_rl_overlay"
    elsewhere = {f"{p.relative_to(package)}: {m}" for p in package.rglob("*.py") if p.name != "reader.py" for m in reads.findall(p.read_text())}
    assert not elsewhere, "read outside reader.py"
    assert set(reads.findall((package / "config" / "reader.py").read_text())) == set(reader.VARIABLES)


def _keys_read(*functions) -> set[str]:
    """The keys `functions` read by name: the literal key of a typed read
    (reader.string(data, "key", ...) and the like) or of a dict's get."""
    typed = {"string", "boolean", "natural", "strings", "version", "iso_date", "cutoff", "requirements", "string_table", "_get"}
    found = set()
    for function in functions:
        for node in ast.walk(ast.parse(inspect.getsource(function).lstrip())):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Name) and node.func.id in typed and len(node.args) > 1:
                key = node.args[1]
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
                key = node.args[0]
            else:
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.add(key.value)
    return found


@pytest.mark.parametrize(("place", "readers"), [
    (schema.PYPROJECT, (reader.project_options,)),
    (schema.PIN, (pins.read_pin, pins.read_rebase_policy, pins.read_release)),
])
def test_the_readers_read_exactly_the_schemas_keys(place, readers):
    """The readers refuse a key the schema lacks (their known keys are the
    schema's); this checks the other way: each key the schema declares, and
    each of its sub-tables, is read, and nothing else is."""
    declared = {part for s in schema.settings_of(place) for part in s.name.split(".")}
    read = _keys_read(*readers)
    assert read - declared == set(), f"read by {', '.join(r.__name__ for r in readers)} but not in config/schema.py"
    assert declared - read == set(), f"in config/schema.py but never read by {', '.join(r.__name__ for r in readers)}"


def test_the_schema_declares_each_setting_once_and_in_full():
    names = [(s.place.name, s.name) for s in schema.SETTINGS]
    assert len(names) == len(set(names)), "a setting declared twice"
    variables = [s.name for s in schema.SETTINGS if s.place.column == "variable"]
    assert len(variables) == len(set(variables)), "a variable in two places"
    assert all(re.fullmatch(r"MRL_[A-Z0-9_]+", name) for name in variables)
    assert {s.place for s in schema.SETTINGS} == set(schema.PLACES)
    empty = [s.name for s in schema.SETTINGS if not (s.type and s.default and s.meaning)]
    assert not empty, "a setting without its type, default or meaning"
    assert not [s.name for s in schema.SETTINGS if "|" in s.type + s.default + s.meaning], "a | would split the docs' row"


def test_the_settings_file_is_refused_where_a_row_is_wrong():
    """resources/settings.toml is checked as it is read: a missing or extra
    field, an unknown place, a name twice in a place, each named with its row."""
    row = '[[setting]]\nplace = "environment"\nname = "SOME_NAME"\ntype = "t"\ndefault = "d"\nmeaning = "m"\n'
    assert [s.name for s in schema.load(row, "f")] == ["SOME_NAME"]
    wrong = {
        row + row.replace("meaning", "meanings"): "setting 2: expected the fields",
        row.replace('"d"', '""'): "setting 1: expected the fields",
        row.replace("environment", "elsewhere"): "unknown place 'elsewhere'",
        row + row: "setting 2: SOME_NAME is in environment twice",
        "": "expected [[setting]] tables",
    }
    for text, said in wrong.items():
        with pytest.raises(ValueError, match=re.escape(said)):
            schema.load(text, "f")


def test_the_scripts_variables_are_used_where_the_schema_says():
    """The schema's variables of the scripts, the tests and the workflows are
    each read there (a variable they stopped reading leaves the schema too)."""
    places = [ROOT / "scripts", ROOT / "tests", ROOT / ".github", ROOT / "overlay" / "maxtext_rl_overlay" / "tpucell"]
    suites = [ROOT / "tests" / suite for suite in ("fixes", "pipeline", "rebase", "bench")]
    absent = [str(p.relative_to(ROOT)) for p in places + suites if not p.is_dir()]
    if absent:  # a rebase's fast tests run in a copy of the checkout that holds tests/unit alone of the suites
        pytest.skip(f"this copy of the project lacks {', '.join(absent)}: would have checked that every variable of the "
                    "scripts, tests, workflows and TPU cell in config/schema.py is still used there")
    text = "\n".join(p.read_text(errors="replace") for place in places for p in place.rglob("*")
                     if p.is_file() and p.suffix in (".py", ".sh", ".yml", ".toml"))
    unused = [name for name in reader.TEST_VARIABLES if not re.search(rf"\b{name}\b", text)]
    assert not unused, "in config/schema.py but in no script, test or workflow"


def test_every_mrl_variable_read_anywhere_is_in_the_schema():
    """The other way round: an MRL_* variable that the package, the scripts,
    the tests or the workflows name is a setting of the schema (and so a row
    of docs/configuration.md)."""
    places = [ROOT / "overlay", ROOT / "scripts", ROOT / "tests", ROOT / ".github", ROOT / "image"]
    named = {name for place in places for p in place.rglob("*") if p.is_file() and p.suffix in (".py", ".sh", ".yml", ".toml", "")
             for name in re.findall(r"\bMRL_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(errors="replace"))}
    missing = sorted(named - {s.name for s in schema.SETTINGS})
    assert not missing, f"named in the project but not in resources/settings.toml: {missing}"


def test_the_docs_tables_are_the_schemas():
    """docs/configuration.md (the README's maintainers section links it)
    shows the schema's tables, generated: a setting changed in resources/settings.toml
    changes the page in the same commit."""
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == schema.with_tables(page, "docs/configuration.md"), \
        f"docs/configuration.md's tables differ from config/schema.py: run {schema.REGENERATE} (in the checkout, with .venv/bin/python)"
    documented = set(re.findall(r"(?m)^\| `([^`]+)` \|", page))
    assert documented == {s.name for s in schema.SETTINGS}, "a table row outside the generated part"


def test_the_generator_prints_the_tables_and_rewrites_only_its_part(tmp_path):
    command = [sys.executable, "-m", "maxtext_rl_overlay.config.schema", "--markdown"]
    printed = subprocess.run(command, capture_output=True, text=True)
    assert printed.returncode == 0 and printed.stdout == schema.markdown()
    page = tmp_path / "page.md"
    page.write_text(f"# prose\n\n{schema.BEGIN}\n| stale |\n{schema.END}\nmore prose\n")
    assert subprocess.run([*command, str(page)]).returncode == 0
    assert page.read_text() == f"# prose\n\n{schema.BEGIN}\n\n{schema.markdown()}\n{schema.END}\nmore prose\n"
    page.write_text("# no markers\n")
    refused = subprocess.run([*command, str(page)], capture_output=True, text=True)
    assert refused.returncode == 1 and "expected the lines" in refused.stderr and page.read_text() == "# no markers\n"
