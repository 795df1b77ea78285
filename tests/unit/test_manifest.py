"""The manifest is a format: typed records whose JSON form the build writes
and `verify` reads, on another machine, with another copy of this code."""

from __future__ import annotations

import dataclasses
import json

import pytest

from maxtext_rl_overlay.core import manifest
from maxtext_rl_overlay.core.errors import OverlayError


def _record(built_against: manifest.BuiltAgainst | None, left_out: tuple[str, ...] = ()) -> manifest.Manifest:
    dist = manifest.Distribution(
        version="0.1.8+mrl.2", import_package="tunix", from_pin=True,
        pin=manifest.PinRecord("https://example.invalid/tunix", "c" * 40, "t" * 40, "2026-08-05T00:09:38-07:00"),
        source=manifest.SourceRecord("t" * 40, "c" * 40, None),
        wheel=manifest.WheelFile("google_tunix-0.1.8+mrl.2-py3-none-any.whl", "a" * 64),
        series=(manifest.PatchRecord("0001-x.patch", "Fix x", "Pending", True, ("tunix/x.py",), "b" * 64, None),),
        files={"tunix/x.py": "d" * 64}, built_against=built_against, left_out=left_out,
    )
    env = manifest.EnvironmentRecord("maxtext[tpu-post-train]==0.2.4", "maxtext",
                                     manifest.TorchRecord("2.11.0", "2.11.0+cpu", True, "0.26.0"),
                                     manifest.Adapter("maxtext-vllm-adapter", "0.1.0", manifest.WheelFile("a.whl", "e" * 64), "mt.whl:dir/"))
    return manifest.Manifest("0.1.0", 2, {"google-tunix": dist}, ("vllm",), env)


@pytest.mark.parametrize("left_out", [(), ("backport-0a1b2c3d4-y.patch",)], ids=["all-applied", "left-out"])
@pytest.mark.parametrize("built_against", [None, manifest.BuiltAgainst("2.11.0", "13.0")])
@pytest.mark.parametrize("project", [None, manifest.ProjectRecord("f" * 40, ("README.md",))], ids=["no-git", "commit"])
def test_json_round_trip_is_exact(built_against, project, left_out):
    record = dataclasses.replace(_record(built_against, left_out), project=project)
    text = record.dumps()
    assert manifest.Manifest.loads(text) == record
    assert manifest.Manifest.loads(text).dumps() == text
    doc = json.loads(text)
    assert doc["format"] == manifest.FORMAT and list(doc) == sorted(doc)
    # A pure-Python build has no built_against key at all (the format before the record types).
    assert ("built_against" in doc["distributions"]["google-tunix"]) == (built_against is not None)


def test_a_manifest_from_before_left_out_reads_as_every_patch_applied():
    doc = json.loads(_record(None).dumps())
    del doc["distributions"]["google-tunix"]["left_out"]
    assert manifest.Manifest.loads(json.dumps(doc)).distributions["google-tunix"].left_out == ()


def test_verify_names_what_was_left_out_of_a_stand_in():
    """A stand-in built without a patch whose code it lacks: verify's source
    line names the patch beside the unpinned tree."""
    from maxtext_rl_overlay.checks import verify

    dist = dataclasses.replace(_record(None, ("backport-0a1b2c3d4-y.patch",)).distributions["google-tunix"], from_pin=False)
    finding = verify.source_finding("google-tunix", dist, require_pinned=False)
    assert finding.found == "t" * 12 + " (left out of it: backport-0a1b2c3d4-y.patch)" and finding.ok, finding
    assert not verify.source_finding("google-tunix", dist, require_pinned=True).ok
    assert verify.source_finding("google-tunix", dataclasses.replace(dist, from_pin=True, left_out=()), require_pinned=True).ok


def test_a_damaged_or_foreign_manifest_is_refused_in_words():
    doc = json.loads(_record(None).dumps())
    with pytest.raises(OverlayError, match="format 99"):
        manifest.Manifest.loads(json.dumps(dict(doc, format=99)))
    del doc["distributions"]["google-tunix"]["wheel"]
    with pytest.raises(OverlayError, match="damaged .*reinstall"):
        manifest.Manifest.loads(json.dumps(doc))


def test_verify_depends_on_the_format_alone():
    """verify and manifest import nothing of the build side (pins, sources,
    patching, wheels, environment...): a TPU VM needs only the format."""
    import ast
    import pathlib

    import maxtext_rl_overlay
    from maxtext_rl_overlay.checks import verify

    package = pathlib.Path(str(maxtext_rl_overlay.__file__)).parent
    folders = {p.name for p in package.iterdir() if p.is_dir()}  # from ..core import x: x is the module
    for module in (verify, manifest):
        tree = ast.parse(pathlib.Path(str(module.__file__)).read_text())
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        imported = {n.module.rsplit(".", 1)[-1] for n in froms if n.module and n.module.rsplit(".", 1)[-1] not in folders}
        imported |= {a.name for n in froms if not n.module or n.module.rsplit(".", 1)[-1] in folders for a in n.names}
        # (staging: its atomic write of verify --json FILE, no build logic; output: the channel its NO goes through;
        # verdict: the skeleton the verdict commands share, over those two; jsonread: the JSON reader;
        # host_facts: a probe, standard library only, whose account of a host's deviations the TPU cell shares)
        assert imported <= {"manifest", "proc", "errors", "digest", "tables", "probes", "reports", "staging", "output", "verdict",
                            "jsonread", "host_facts"}, (module, imported)


def test_verify_fails_on_a_distribution_the_release_was_built_without():
    """A release built with --only records what it left out (not_built);
    verify says so, rather than passing or leaving it to a failed import."""
    from maxtext_rl_overlay.checks import verify

    doc = _record(None)
    assert doc.not_built == ("vllm",)
    findings = verify.check(doc)
    (left_out,) = [f for f in findings if f.distribution == "vllm"]
    assert not left_out.ok and left_out.what == "built" and left_out.shown.startswith("NOT BUILT into this release")
    assert any("built without vllm (build --only)" in line for line in verify.explain(findings, doc))
    assert "vllm" not in {f.distribution for f in verify.check(dataclasses.replace(doc, not_built=()))}
