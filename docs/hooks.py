"""mkdocs hook: publish the figures the benchmarks write, benchmarks/results/*, as results/*.

The pages link those files where they lie in the repository (`../benchmarks/results/NAME`),
so the links also work when the Markdown is read on its own; the site gets each file that
exists as `results/NAME` (a page for .md, a copy for .json and .png) and the links are
rewritten to it. A link to a file no benchmark has written stays unresolved and fails
`mkdocs build --strict`.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PUBLISHED = {".md", ".json", ".png"}
# ](../benchmarks/results/  ->  ](results/   (one ../ fewer: docs/ is the site's root)
LINK = re.compile(r"\]\(((?:\.\./)*)\.\./benchmarks/results/")


def on_files(files, config):
    for path in sorted(RESULTS.glob("*")):
        if path.is_file() and path.suffix in PUBLISHED:
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    return LINK.sub(lambda m: f"]({m.group(1)}results/", markdown)
