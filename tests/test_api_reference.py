"""The API reference as a reader sees it: the site built by ``mkdocs build --strict`` (the
docs' dependencies, requirements-docs.txt, which requirements-dev.txt includes) holds every public name of
``fluxmpi_py`` and ``fluxmpi_py.horovod``, as imported, with its entry, its row in its page's
table of names, and, for classes and functions, its signature with every parameter that
``inspect.signature`` gives; no signature shows a private name. With chromium installed, the
site opened from disk shows the signatures and its search answers (scripts/check_site.py)."""

import inspect
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts"))
import check_site  # noqa: E402

ROOT = check_site.ROOT

pytest.importorskip("mkdocs", reason="the docs' dependencies: make docs installs them")
pytest.importorskip("griffe", reason="the docs' dependencies: make docs installs them")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return str(out)


def imported_api():
    """{dotted name: parameter names, or None for a constant, a module or a class whose
    constructor is its base's (an exception)}, from the imported package."""
    import fluxmpi_py
    import fluxmpi_py.horovod as hvd

    api = {}
    for mod, path in ((fluxmpi_py, "fluxmpi_py"), (hvd, "fluxmpi_py.horovod")):
        for name in mod.__all__:
            obj = getattr(mod, name)
            params = None
            if inspect.isclass(obj) and "__init__" in vars(obj):
                params = list(inspect.signature(obj).parameters)
            elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
                params = list(inspect.signature(obj).parameters)
            api[f"{path}.{name}"] = params
    return api


def test_every_public_name_has_its_entry_and_signature(site):
    api = imported_api()
    assert len(api) > 130 and "fluxmpi_py.Init" in api and "fluxmpi_py.horovod.init" in api
    problems = check_site.check_reference(site, api)
    assert not problems, "\n".join(problems)


def test_the_static_reading_matches_the_import(site):
    # make docs checks the names griffe reads from the sources, without importing them
    assert set(check_site.public_api()) == set(imported_api())


def test_the_check_finds_a_missing_name_and_a_private_default(tmp_path):
    (tmp_path / "api").mkdir()
    (tmp_path / "api-horovod.html").write_text("")
    entry = (
        '<table><a href="#fluxmpi_py.Init"></a></table><div class="doc doc-object">'
        '<h2 id="fluxmpi_py.Init" class="doc doc-heading">Init</h2>'
        '<div class="doc-signature highlight"><pre><code>Init(timeout=_stall._UNSET)'
        "</code></pre></div><p>Parameters:</p>"
    )
    (tmp_path / "api" / "runtime.html").write_text(entry)
    problems = check_site.check_reference(
        str(tmp_path), {"fluxmpi_py.Init": ["timeout", "debug"], "fluxmpi_py.barrier": []}
    )
    assert any("barrier: no entry" in p for p in problems), problems
    assert any("lacks ['debug']" in p for p in problems), problems
    assert any("private name" in p for p in problems), problems


@pytest.mark.skipif(check_site.chromium() is None, reason="no chromium (apt-get install chromium)")
def test_the_site_from_disk_in_chromium(site, tmp_path):
    png = tmp_path / "search.png"
    assert check_site.check_browser(site, str(png)) == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
