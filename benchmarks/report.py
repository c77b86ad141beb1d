"""Results out: each benchmark writes its results dict as JSON and, beside it with the
same stem, a markdown page rendered from that dict.

A script describes its results dict as a `Report` (the tables of figures, the
settings, the device, the versions); `render_markdown` is the one renderer. Because
the page is rendered from the dict alone, `--render-only RESULTS.json` renders it
again from a results file, without measuring.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Table:
    """A markdown table; `align` holds one "l" or "r" per column (default: all left)."""
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    align: str = ""

    def markdown(self) -> str:
        rule = ["---:" if a == "r" else "---" for a in self.align.ljust(len(self.header), "l")]
        lines = [self.header, rule, *self.rows]
        return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


@dataclass
class Report:
    """What a results page shows: a title, sentences before the tables, the tables of
    figures, then the settings, the device and the versions the run used."""
    title: str
    script: str  # the benchmark's path from the repository root
    tables: Sequence[Table]
    settings: dict[str, Any]
    device: str
    versions: dict[str, str]
    notes: Sequence[str] = field(default_factory=list)

    def figures(self) -> str:
        """The notes and the tables: the page without its title, settings, device and
        versions."""
        return "\n\n".join([*self.notes, *(table.markdown() for table in self.tables)])


def setting(value: Any) -> str:
    """A setting's value as the command line would spell it."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "-"
    return "-" if value is None else str(value)


def render_markdown(report: Report, results_path: str) -> str:
    """The page for the results file at `results_path` (as a reader would type it)."""
    parts = [f"# {report.title}", report.figures(),
             "## Settings",
             Table(("setting", "value"),
                   [(name, setting(value)) for name, value in report.settings.items()]).markdown(),
             "## Device", report.device,
             "## Versions",
             Table(("package", "version"), list(report.versions.items())).markdown(),
             f"Rendered by `{report.script}` from `{results_path}` (again: `python "
             f"{report.script} --render-only {results_path}`)."]
    return "\n\n".join(part for part in parts if part) + "\n"


Describe = Callable[[dict], Report]


def shown_path(path: Path) -> str:
    """`path` from the repository root when it lies inside, else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def markdown_path(results_path: Path) -> Path:
    return Path(results_path).with_suffix(".md")


def write_results(result: dict, path: Path | str, describe: Describe) -> str:
    """Write `result` as JSON to `path` and its rendered page beside it; returns the page.
    The page is rendered from the JSON as written (tuples become lists), so that
    --render-only gives the same page."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    path.write_text(text)
    return write_markdown(json.loads(text), path, describe)


def write_markdown(result: dict, results_path: Path, describe: Describe) -> str:
    page = render_markdown(describe(result), shown_path(results_path))
    markdown_path(results_path).write_text(page)
    return page


def add_output_args(parser: argparse.ArgumentParser, out_help: str, **out_options) -> None:
    """--out (the JSON results; the page goes beside it) and --render-only."""
    parser.add_argument("--out", help=out_help + "; the markdown page goes beside it, "
                        "same name with .md", **out_options)
    parser.add_argument("--render-only", metavar="RESULTS_JSON", type=Path,
                        help="measure nothing: render the markdown page of an existing "
                             "results file beside it (the other flags are ignored)")


def run_benchmark(argv: Sequence[str] | None, parse_args: Callable, measure: Callable,
                  describe: Describe, default_path: Path) -> dict:
    """A benchmark's main: --render-only RESULTS_JSON renders its page again; else parse
    `argv`, measure, write the results (to --out or `default_path`) and their page,
    print the page."""
    rendered = render_only(argv, describe)
    if rendered is not None:
        return rendered
    args = parse_args(argv)
    result = measure(args)
    path = args.out or default_path
    print(write_results(result, path, describe), end="")
    print(f"saved {path}")
    return result


def render_only(argv: Sequence[str] | None, describe: Describe) -> dict | None:
    """With --render-only RESULTS_JSON in `argv`: write that file's markdown page, print
    it and return the results; else None. Read before the script's own parser, whose
    required flags a render does not need."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--render-only", type=Path)
    path = parser.parse_known_args(argv)[0].render_only
    if path is None:
        return None
    result = json.loads(path.read_text())
    print(write_markdown(result, path, describe), end="")
    print(f"saved {markdown_path(path)}")
    return result
