"""The index helpers: the PEP 503 tree and the flat page (relative links,
sha256 fragments, same wheels same bytes), --base-url, and the local view of
a folder built for a URL that the test matrix installs from."""

from __future__ import annotations

import pytest

from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import indexpages
from unit.unit_support import fake_wheel


def test_simple_tree_and_flat_index_link_relatively_with_hashes(tmp_path):
    fake_wheel(tmp_path, "tpu-inference", "0.25.0+mrl.1")
    fake_wheel(tmp_path, "Google_Tunix", "0.1.8+mrl.1", requires_python=None)
    sums = indexpages.write_index(tmp_path)
    indexpages.write_simple(tmp_path, sums)
    flat = (tmp_path / "index.html").read_text()
    projects = (tmp_path / "simple" / "index.html").read_text()
    assert '<a href="google-tunix/">google-tunix</a>' in projects and '<a href="tpu-inference/">tpu-inference</a>' in projects
    assert 'name="pypi:repository-version" content="1.0"' in projects
    page = (tmp_path / "simple" / "tpu-inference" / "index.html").read_text()
    sha = sums["tpu_inference-0.25.0+mrl.1-py3-none-any.whl"]
    assert f'href="../../tpu_inference-0.25.0%2Bmrl.1-py3-none-any.whl#sha256={sha}" data-requires-python="&gt;=3.12">' in page
    assert f'href="tpu_inference-0.25.0%2Bmrl.1-py3-none-any.whl#sha256={sha}"' in flat
    assert "data-requires-python" not in (tmp_path / "simple" / "google-tunix" / "index.html").read_text()
    assert "://" not in flat + projects + page, "relative links only: the folder can be served anywhere"
    # Same wheels, same bytes.
    again = tmp_path / "again"
    again.mkdir()
    for w in tmp_path.glob("*.whl"):
        (again / w.name).write_bytes(w.read_bytes())
    indexpages.write_simple(again, indexpages.write_index(again))
    for rel in ("index.html", "SHA256SUMS", "simple/index.html", "simple/tpu-inference/index.html", "simple/google-tunix/index.html"):
        assert (again / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


@pytest.mark.parametrize("url", ["ftp://host/x/", "https:///x", "https://host/x/?a=1", "https://host/x/#f", "https://host/a b/", "host/x"])
def test_base_url_must_be_an_http_folder_url(url):
    with pytest.raises(OverlayError, match="--base-url"):
        indexpages.base_url(url)


def test_base_url_is_a_folder():
    assert indexpages.base_url("https://o.github.io/r/v0.1.0") == "https://o.github.io/r/v0.1.0/"
    assert indexpages.base_url("http://127.0.0.1:8000/rel/v0.1.0//") == "http://127.0.0.1:8000/rel/v0.1.0/"


def test_local_view_installs_the_folders_own_wheels(tmp_path):
    dist = tmp_path / "dist"
    dist.mkdir()
    wheel = fake_wheel(dist, "tpu-inference", "0.25.0+mrl.1")
    (dist / "constraints.txt").write_text("# x\n--find-links .\nfoo==1\n")
    assert indexpages.local_view(dist, tmp_path / "view") == dist / "constraints.txt"
    assert not (tmp_path / "view").exists()
    (dist / "constraints.txt").write_text("# x\n--find-links https://o.github.io/r/v0.1.0/\nfoo==1\n")
    view = indexpages.local_view(dist, tmp_path / "view")
    assert view == tmp_path / "view" / "constraints.txt"
    assert view.read_text() == "# x\n--find-links .\nfoo==1\n"
    assert (tmp_path / "view" / wheel.name).resolve() == wheel.resolve()
    assert "https://" in (dist / "constraints.txt").read_text(), "the release itself is left as built"
