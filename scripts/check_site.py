"""Check the built documentation site (``make docs`` runs it after ``mkdocs build``).

    python scripts/check_site.py SITE_DIR [--browser] [--screenshot PNG]

- Every public name (``fluxmpi_py.__all__`` and ``fluxmpi_py.horovod``'s, read from the
  sources as the reference is, scripts/griffe_fluxmpi.py) has its entry on an API reference
  page (its heading, id ``fluxmpi_py.NAME``), in that page's table of names, and, for a class
  or a function, its signature with every parameter; a class or function with parameters
  has a parameter table.
- No signature shows a private name (``_stall._UNSET``): nothing that starts with ``_``.
- ``--browser``: headless Chromium (``chromium``, or $CHROMIUM) opens the site from disk
  (file://): a reference page shows Init's signature, and a search from index.html returns
  results (docs/javascripts/offline-search.js). ``--screenshot`` saves that search's page.

Exits 1 naming each problem found.
"""

from __future__ import annotations

import argparse
import glob
import html
import os
import re
import shutil
import subprocess
import sys

import griffe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY = re.compile(r'<h[2-6] id="(fluxmpi_py\.[\w.]+)" class="doc doc-heading">')
SIGNATURE = re.compile(r'<div class="doc-signature highlight"><pre[^>]*>(.*?)</pre></div>', re.S)
PRIVATE = re.compile(r"(?<![\w.])_\w*[A-Za-z]|\._\w")


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def public_api() -> dict[str, list[str] | None]:
    """{dotted name: its parameter names, or None for a constant or a module}."""
    ext = griffe.load_extensions(
        os.path.join(ROOT, "scripts", "griffe_fluxmpi.py") + ":FluxmpiPublicApi"
    )
    pkg = griffe.load("fluxmpi_py", search_paths=[ROOT], extensions=ext)
    out: dict[str, list[str] | None] = {}
    for mod in (pkg, pkg["horovod"]):
        for name in [str(n) for n in mod.exports or []]:
            obj = mod[name]
            obj = obj.final_target if obj.is_alias else obj
            params = None
            if obj.is_function:
                params = [p.name for p in obj.parameters]
            elif obj.is_class and "__init__" in obj.members:  # else its base's (an exception)
                params = [p.name for p in list(obj.members["__init__"].parameters)[1:]]
            out[f"{mod.path}.{name}"] = params
    return out


def entries(site: str) -> dict[str, tuple[str, str]]:
    """{entry id: (page path, the entry's HTML up to the next entry)} of the API pages."""
    found = {}
    pages = glob.glob(os.path.join(site, "api", "*.html")) + [
        os.path.join(site, "api-horovod.html")
    ]
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        marks = list(ENTRY.finditer(text))
        for m, nxt in zip(marks, marks[1:] + [None]):
            found[m.group(1)] = (page, text[m.end() : nxt.start() if nxt else len(text)])
    return found


def check_reference(site: str, api: dict[str, list[str] | None]) -> list[str]:
    problems = []
    found = entries(site)
    tables: dict[str, str] = {}
    for name, params in api.items():
        if name not in found:
            problems.append(f"{name}: no entry in the API reference")
            continue
        page, body = found[name]
        if page not in tables:
            with open(page, encoding="utf-8") as f:
                tables[page] = f.read().split('class="doc doc-object', 1)[0]
        if f'href="#{name}"' not in tables[page]:
            problems.append(f"{name}: not in the table of names of {os.path.basename(page)}")
        if params is None:
            continue
        sig = SIGNATURE.search(body)
        if sig is None:
            problems.append(f"{name}: no signature")
            continue
        shown = text_of(sig.group(1))
        short = name.rsplit(".", 1)[1]
        if not shown.lstrip().startswith(short + "("):
            problems.append(f"{name}: the signature does not start with {short}(: {shown[:80]!r}")
        missing = [p for p in params if not re.search(rf"\b{re.escape(p)}\b", shown)]
        if missing:
            problems.append(f"{name}: the signature lacks {missing}: {shown!r}")
        if params and "Parameters:" not in text_of(body.split("doc-signature", 1)[1][:200000]):
            problems.append(f"{name}: no parameter table")
    for name, (_page, body) in found.items():
        for sig in SIGNATURE.finditer(body.split('<div class="doc doc-object', 1)[0]):
            shown = text_of(sig.group(1))
            if PRIVATE.search(shown):
                problems.append(f"{name}: a private name in its signature: {shown.strip()!r}")
    return problems


def chromium() -> str | None:
    return (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )


def browse(browser: str, url: str, *extra: str) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
    out = subprocess.run(
        [*cmd, *extra, url], capture_output=True, text=True, timeout=120, check=False
    )
    return out.stdout


def check_browser(site: str, screenshot: str | None) -> list[str]:
    browser = chromium()
    if browser is None:
        return ["--browser: no chromium on PATH (apt-get install chromium, or set CHROMIUM)"]
    problems = []
    base = "file://" + os.path.abspath(site)
    dom = browse(browser, f"{base}/api/runtime.html", "--dump-dom")
    sig = SIGNATURE.search(dom[dom.find('id="fluxmpi_py.Init"') :])
    if sig is None or not text_of(sig.group(1)).startswith("Init("):
        problems.append("browser: api/runtime.html shows no signature of Init")
    query = "?q=allreduce_gradients"
    dom = browse(browser, f"{base}/index.html{query}", "--dump-dom")
    hits = dom.count('class="md-search-result__item"')
    if hits == 0 or 'data-md-component="search" role="dialog" hidden' in dom:
        problems.append(f"browser: a search from index.html (file://) found {hits} results")
    elif "allreduce_gradients" not in dom.split("md-search-result__list", 1)[1]:
        problems.append("browser: the search results do not name allreduce_gradients")
    else:
        print(f"check_site: from disk, search {query[3:]!r}: {hits} results")
    if screenshot:
        browse(
            browser,
            f"{base}/index.html{query}",
            "--window-size=1300,900",
            f"--screenshot={os.path.abspath(screenshot)}",
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site")
    parser.add_argument("--browser", action="store_true")
    parser.add_argument("--screenshot")
    args = parser.parse_args(argv)
    api = public_api()
    problems = check_reference(args.site, api)
    if args.browser:
        problems += check_browser(args.site, args.screenshot)
    for p in problems:
        print("check_site:", p, file=sys.stderr)
    if not problems:
        print(f"check_site: {len(api)} public names, each with its entry and signature")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
