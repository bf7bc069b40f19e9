"""MkDocs hooks (mkdocs.yml).

- The plots under benchmarks/results/ join the site: docs/measurements.md shows them as
  ``../benchmarks/results/X.png``, a path that works on a repository browser; the site copies
  each plot beside the pages and points there.
- A page of docs/sections/ opens with a ``##`` heading (the pages were the README's sections);
  on the site that heading is the page's title.
"""

from __future__ import annotations

import os

from mkdocs.structure.files import File

RESULTS = "benchmarks/results"
OUTSIDE = f"../{RESULTS}/"


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
    if page.file.src_uri.startswith("sections/") and markdown.startswith("## "):
        return markdown[1:]
    # Only pages at the top of docs/ link this way (docs/measurements.md).
    if "/" not in page.file.src_uri:
        return markdown.replace(f"]({OUTSIDE}", f"]({RESULTS}/")
    return markdown
