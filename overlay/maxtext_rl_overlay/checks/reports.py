"""The reports of the commands that give a verdict, as typed, versioned JSON
documents: `verify --json`, `smoke --json`, `test-matrix --json` and the TPU
cell's cell.json. docs/reports.md documents each field and the versioning
policy (tests/unit/test_reports.py holds the two together).

Every document's first two keys are "report_version" (an int, one sequence
per kind) and "kind". Each is written by one function of its stage:
verify.write_json, smoke.report.write_json and testmatrix.write_json through
`dumps`, tpucell/host.py's Cell.write (standard library alone, on the TPU
host) in the same form; `load_report` reads any of them back and refuses, in
words, another kind or another version than this tool writes."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Literal, NotRequired, TypedDict, cast, get_args, overload

from ..core.errors import OverlayError
from ..core.jsonread import json_object
from ..core.staging import FileOwner

Kind = Literal["verify", "smoke", "test-matrix", "tpu-cell"]
KINDS: tuple[Kind, ...] = get_args(Kind)

#: Each kind's current report_version: what this tool writes, and the only one it reads.
VERSIONS: dict[Kind, int] = {"verify": 2, "smoke": 1, "test-matrix": 1, "tpu-cell": 1}


class FindingDocument(TypedDict):
    """One of verify's findings (verify.Finding)."""

    distribution: str
    check: str
    subject: str
    expected: str
    found: str
    shown: str
    ok: bool
    problem: str | None
    remedy: str


class VerifyDocument(TypedDict):
    report_version: int
    kind: Literal["verify"]
    finished: bool
    ok: bool
    verdict: str
    findings: list[FindingDocument]
    explanation: list[str]
    deviations: list[str]
    closure_checked: bool
    imports_checked: bool
    resolution_cutoff: str


class SmokeDocument(TypedDict):
    report_version: int
    kind: Literal["smoke"]
    finished: bool
    ok: bool
    failed: list[str]
    cannot_run: str | None
    cpu_simulation: bool
    notice: str | None
    configurations: list[dict[str, Any]]
    skipped: dict[str, str]


class MatrixRunDocument(TypedDict):
    """One run of a cell of the test matrix (testmatrix.CellResult)."""

    cell: str
    ok: bool
    verify: str
    passed: int
    failed: int
    errors: int
    skipped: int
    seconds: float
    junit: str | None
    stand_ins: dict[str, int]


class MatrixDocument(TypedDict):
    report_version: int
    kind: Literal["test-matrix"]
    finished: bool
    ok: bool
    platform: str
    quick: bool
    runs: list[MatrixRunDocument]


class CellStep(TypedDict):
    """One step's result in cell.json; `tests` where it wrote JUnit XML,
    `summary` where the step says more than its log's last line, `failed` and
    `cannot_run` read from smoke's own report."""

    rc: int | None
    seconds: float
    when: str
    stand_ins: list[str]
    timed_out: NotRequired[bool]
    command: NotRequired[str]
    tail: NotRequired[list[str]]
    tests: NotRequired[dict[str, int]]
    summary: NotRequired[str]
    failed: NotRequired[list[str] | None]
    cannot_run: NotRequired[str | None]


class CellDocument(TypedDict):
    """cell.json: the TPU cell's report, accumulated over calls (written by
    tpucell/host.py, which runs on the TPU host with the standard library
    alone: it reads this type only when checked, and says its report_version
    again, which tests/unit/test_reports.py holds equal)."""

    report_version: int
    kind: Literal["tpu-cell"]
    release: str
    bundle_python: str
    bundle_jax: str
    host: dict[str, Any]
    deviations: list[str]
    steps: dict[str, CellStep]
    bundle: NotRequired[dict[str, Any]]


#: The documents by kind, and the records they hold (docs/reports.md's tables).
DOCUMENTS: dict[Kind, type] = {"verify": VerifyDocument, "smoke": SmokeDocument, "test-matrix": MatrixDocument, "tpu-cell": CellDocument}
RECORDS: tuple[type, ...] = (FindingDocument, MatrixRunDocument, CellStep)
#: Any kind's document.
Document = VerifyDocument | SmokeDocument | MatrixDocument | CellDocument


def dumps(document: Document) -> str:
    """A document's text: its keys in their declared order (report_version and
    kind first, which `owner` reads), one space of indent, a final newline."""
    return json.dumps(document, indent=1) + "\n"


#: What smoke's --json FILE held before report_version (still smoke's own to replace).
_SMOKE_BEFORE_VERSIONS = b'{\n "written_by": "maxtext-rl-overlay smoke"'


def owner(kind: Kind) -> FileOwner:
    """How to tell a report of `kind` the tool wrote (of any version): a
    --json FILE is replaced only where it is empty or one of these (a typo
    must not cost a file)."""
    head = re.compile(rb'\A\{\n "report_version": \d+,\n "kind": ' + re.escape(json.dumps(kind).encode()) + rb",")

    def owns(text: bytes) -> bool:
        return bool(head.match(text)) or (kind == "smoke" and text.startswith(_SMOKE_BEFORE_VERSIONS))

    return FileOwner(f"a {kind} result", f'first keys "report_version" and "kind": "{kind}"', owns)


@overload
def load_report(source: pathlib.Path | str, kind: Literal["verify"]) -> VerifyDocument: ...
@overload
def load_report(source: pathlib.Path | str, kind: Literal["smoke"]) -> SmokeDocument: ...
@overload
def load_report(source: pathlib.Path | str, kind: Literal["test-matrix"]) -> MatrixDocument: ...
@overload
def load_report(source: pathlib.Path | str, kind: Literal["tpu-cell"]) -> CellDocument: ...
@overload
def load_report(source: pathlib.Path | str, kind: Kind) -> Document: ...


def load_report(source: pathlib.Path | str, kind: Kind) -> Document:
    """The report of `kind` in the file `source` (a path) or the text
    `source` (a str), checked to be that kind at this tool's version.
    Raises OverlayError saying which: not JSON, another kind, an older or a
    newer report_version (a consumer of another version must not misread it).
    Typed as that kind's document: its fields are those its one writer
    writes at that version (read as written, not checked one by one)."""
    if isinstance(source, pathlib.Path):
        where = str(source)
        try:
            text = source.read_text()
        except OSError as exc:
            raise OverlayError(f"{where}: cannot read the {kind} report ({exc.strerror}).") from None
    else:
        where, text = f"the {kind} report", source
    doc = json_object(text, where, f": not a {kind} report the tool wrote.")
    found_kind, version = doc.get("kind"), doc.get("report_version")
    if found_kind != kind:
        said = f"a {found_kind} report" if isinstance(found_kind, str) else "not a versioned report (no \"kind\")"
        raise OverlayError(f"{where} is {said}, not a {kind} report.")
    want = VERSIONS[kind]
    if not isinstance(version, int) or isinstance(version, bool):
        raise OverlayError(f"{where}: its report_version is {version!r}, not a number: not a {kind} report the tool wrote.")
    if version != want:
        which = "an older" if version < want else "a newer"
        raise OverlayError(f"{where} is {kind} report_version {version}, {which} format than this tool's ({want}): read it with the "
                           f"maxtext-rl-overlay that wrote it, or make it again with this one (docs/reports.md: versioning).")
    return cast(Document, doc)
