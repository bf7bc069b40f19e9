"""MkDocs hooks (mkdocs.yml).

- The plots under benchmarks/results/ join the site: docs/measurements.md shows them as
  ``../benchmarks/results/X.png``, a path that works on a repository browser; the site copies
  each plot beside the pages and points there.
- A page of docs/sections/ opens with a ``##`` heading (the pages were the README's sections);
  on the site that heading is the page's title.
- An API reference page (docs/api/*.md, docs/api-horovod.md) opens with its names in a table:
  the line ``<!-- api-names -->`` becomes one row per ``::: name`` directive of the page (its
  link, its kind and its docstring's first sentence), read from the sources as the reference
  is (scripts/griffe_fluxmpi.py), so the table cannot drift from the entries below it.
- The search index is also written as search/search_index.js (``var __index = ...``), which
  docs/javascripts/offline-search.js loads and searches when the site is opened from disk:
  a browser gives a file:// page neither the theme's web worker nor its fetch of the index.
"""

from __future__ import annotations

import functools
import os
import re

import griffe
from mkdocs.structure.files import File

RESULTS = "benchmarks/results"
OUTSIDE = f"../{RESULTS}/"
NAMES_MARK = "<!-- api-names -->"
DIRECTIVE = re.compile(r"^::: ([\w.]+)$", re.M)
SENTENCE_END = re.compile(r"(?<=[.!?])\s")


@functools.lru_cache(maxsize=1)
def _package(root: str) -> griffe.Module:
    extensions = griffe.load_extensions(
        os.path.join(root, "scripts", "griffe_fluxmpi.py") + ":FluxmpiPublicApi"
    )
    return griffe.load("fluxmpi_py", search_paths=[root], extensions=extensions)


def _kind(obj) -> str:
    target = obj.final_target if obj.is_alias else obj
    if target.is_module:
        return "command" if "__main__" in (target.source or "") else "module"
    if target.is_class:
        bases = " ".join(str(b) for b in target.bases)
        return "exception" if "Error" in bases or "Warning" in bases else "class"
    return "function" if target.is_function else "constant"


def _summary(obj) -> str:
    """The docstring's first sentence, on one line, as Markdown for a table cell."""
    doc = obj.docstring.value if obj.docstring is not None else ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return SENTENCE_END.split(first, maxsplit=1)[0].replace("|", "\\|")


def _names_table(markdown: str, root: str) -> str:
    pkg = _package(root)
    rows = ["| Name | Kind | What it is |", "| --- | --- | --- |"]
    for path in DIRECTIVE.findall(markdown):
        obj = pkg[path[len("fluxmpi_py.") :]] if path != "fluxmpi_py" else pkg
        short = path[len("fluxmpi_py.") :]
        rows.append(f"| [`{short}`](#{path}) | {_kind(obj)} | {_summary(obj)} |")
    return markdown.replace(NAMES_MARK, "\n".join(rows))


def on_files(files, config):
    root = os.path.dirname(config["docs_dir"])  # the repository: docs/ is at its top
    for name in sorted(os.listdir(os.path.join(root, RESULTS))):
        if name.endswith(".png"):
            files.append(
                File(
                    f"{RESULTS}/{name}",
                    src_dir=root,
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files


def on_page_markdown(markdown, page, config, files):
    if NAMES_MARK in markdown:
        markdown = _names_table(markdown, os.path.dirname(config["docs_dir"]))
    if page.file.src_uri.startswith("sections/") and markdown.startswith("## "):
        return markdown[1:]
    # Only pages at the top of docs/ link this way (docs/measurements.md).
    if "/" not in page.file.src_uri:
        return markdown.replace(f"]({OUTSIDE}", f"]({RESULTS}/")
    return markdown


def on_post_build(config):
    index = os.path.join(config["site_dir"], "search", "search_index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            data = f.read()
        with open(index[: -len(".json")] + ".js", "w", encoding="utf-8") as f:
            f.write(f"var __index = {data};\n")
