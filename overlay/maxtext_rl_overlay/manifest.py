"""The build manifest: what each overlay wheel was built from, and the sha256
of every installed file its series touches. Written at build time into the
maxtext-rl-overlay wheel; read back by `verify` on the target machine.

Plain JSON, keys sorted, no machine paths or times: the same pins give the
same manifest, and so the same maxtext-rl-overlay wheel, on any machine."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import zipfile
from typing import TYPE_CHECKING
from importlib import resources

from .digest import sha256_file
from .errors import OverlayError
from .patching import AppliedPatch
from .pins import Pin
from .sources import Source

if TYPE_CHECKING:
    from .environment import Environment

FORMAT = 1
RESOURCE = "manifest.json"


def entry(pin: Pin, source: Source, version: str, wheel: pathlib.Path, series: list[AppliedPatch], patch_ids: dict[str, str]) -> dict:
    """The manifest entry of one built distribution."""
    touched = sorted({f for p in series for f in p.files})
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        # Files the series touches that the wheel installs (a touched test or
        # build file is not installed, so there is nothing to verify of it).
        files = {f: hashlib.sha256(zf.read(f)).hexdigest() for f in touched if f in names}
    return {
        "version": version,
        "import_package": pin.import_package,
        "from_pin": source.from_pin,
        "pin": {"repository": pin.repository, "commit": pin.commit, "tree": pin.tree, "date": pin.date},
        "source": {"tree": source.tree, "commit": source.commit, "upstream_version": source.upstream_version},
        "wheel": {"filename": wheel.name, "sha256": sha256_file(wheel)},
        "series": [
            dict(dataclasses.asdict(p), files=list(p.files), sha256=sha256_file(pin.directory / p.name), patch_id=patch_ids.get(p.name))
            for p in series
        ],
        "files": files,
    }


def dumps(distributions: dict[str, dict], *, overlay_version: str, revision: int, not_built: list[str], env: Environment, adapter: dict | None) -> str:
    torch = env.torch
    doc = {
        "format": FORMAT,
        "overlay": {"version": overlay_version, "revision": revision},
        "distributions": distributions,
        "not_built": sorted(not_built),
        # The environment the closure was resolved for: what `verify` checks
        # beyond our wheels, and how it tells the user to restore them.
        "environment": {
            "maxtext": env.maxtext,
            "extra": env.extra,
            "torch": {"version": torch.version, "wanted": torch.wanted, "standin": torch.standin,
                      "torchvision": torch.torchvision},
            # MaxText's vLLM plugin, built from the release: installed by the extra.
            "maxtext_vllm_adapter": adapter,
        },
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def load_installed() -> dict:
    """The manifest of the installed maxtext-rl-overlay wheel."""
    try:
        text = (resources.files(__package__) / RESOURCE).read_text()
    except FileNotFoundError:
        raise OverlayError(
            "this maxtext-rl-overlay carries no build manifest: it was installed from a source "
            "tree, not from a wheel made by scripts/build-wheels.sh. Install the built wheel."
        ) from None
    doc = json.loads(text)
    if doc.get("format") != FORMAT:
        raise OverlayError(f"the installed manifest has format {doc.get('format')}; this tool reads format {FORMAT}.")
    return doc
