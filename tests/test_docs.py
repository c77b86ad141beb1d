"""The manual builds as a site with no warning, and the README stays its short entry point.

`mkdocs build --strict` fails on any warning; mkdocs.yml makes a link to a missing
page or to a missing #anchor, a nav entry without its page and a page left out of
the nav warnings. The README is not part of the site, so its links are checked here.
"""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
# [text](target) or [text](target#anchor); the target without the anchor
LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]*)?\)")
# a row of docs/index.md's command table: | `jaxformer-NAME` ... | what | page |
COMMAND_ROW = re.compile(r"^\| `(jaxformer-[\w-]+)`", re.MULTILINE)


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's banner, not a problem
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(config), "--site-dir", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


def warnings(result: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in (result.stdout + result.stderr).splitlines()
                     if "WARNING" in line or "ERROR" in line or "Error" in line)


def readme_links() -> set[str]:
    return {target for target, _ in LINK.findall((ROOT / "README.md").read_text())
            if target and "://" not in target}


def test_the_manual_builds_in_strict_mode(tmp_path):
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + (warnings(result) or
                                                                        result.stderr[-3000:])
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        assert (tmp_path / "site" / page.with_suffix(".html")).is_file(), page
    # the benchmarks' tables are published beside the pages (docs/hooks.py)
    for table in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert (tmp_path / "site" / "results" / table.with_suffix(".html").name).is_file(), table


def test_the_strict_build_fails_on_a_broken_link_anchor_or_result(tmp_path):
    """The configuration that makes the build above meaningful: on a copy of the
    manual, a link to a missing page, a missing anchor and a benchmark table no
    script wrote each fail the build, named."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[a](no-such-page.md) [b](training.md#no-such-anchor)"
                    " [c](../benchmarks/results/no_such_table.md)\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    for name in ("no-such-page.md", "no-such-anchor", "no_such_table.md"):
        assert name in warnings(result), (name, warnings(result))


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines; the manual belongs in "
                                       f"docs/ (at most {README_MAX_LINES})")


def test_the_readme_links_every_page_of_the_manual():
    links = readme_links()
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert pages, "docs/ has no pages"
    missing = [page for page in pages if page not in links]
    assert not missing, f"README.md does not link {missing}"


def test_the_readme_links_lead_somewhere():
    broken = sorted(target for target in readme_links() if not (ROOT / target).exists())
    assert not broken, f"README.md links files that do not exist: {broken}"


def github_anchors(markdown: str) -> set[str]:
    """The #anchors GitHub gives a file's headings (where the README is read): lower
    case, punctuation dropped, each space a hyphen (mkdocs' differ: it folds '--')."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", heading).replace(" ", "-"))
    return anchors


def test_the_readme_anchors_exist():
    readme = (ROOT / "README.md").read_text()
    broken = []
    for target, anchor in LINK.findall(readme):
        if anchor and "://" not in target:
            text = (ROOT / target).read_text() if target else readme
            if anchor[1:] not in github_anchors(text):
                broken.append(target + anchor)
    assert not broken, f"README.md links headings that do not exist: {broken}"


def test_the_manual_s_command_table_lists_every_console_script():
    """docs/index.md's table of commands holds a row for each console script
    pyproject.toml installs, and none for a command that is not one."""
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    rows = COMMAND_ROW.findall((ROOT / "docs" / "index.md").read_text())
    assert len(rows) == len(set(rows)), f"docs/index.md lists a command twice: {rows}"
    assert set(rows) == scripts, (f"docs/index.md's commands lack {sorted(scripts - set(rows))}"
                                  f" and list {sorted(set(rows) - scripts)}, not installed")
