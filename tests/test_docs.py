"""The docs a clone ships stay true: README's size and set-up lines, no citations of files outside the repository,
every environment flag documented, every relative link resolving, and docs/api.md naming the public API."""

import ast
import inspect
import pathlib
import re
import subprocess
import pytest
import fusegrad
from fusegrad import Tensor
from fusegrad import nn
from fusegrad.nn import datasets, optim, state

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SETUP_LINES = (
    "pip install -e '.[examples]' && python examples/train_digits.py",
    "pip install -e '.[test]' && python -m pytest -q -n 2 tests",
)
# spelled in pieces so that this file does not match itself
OUTSIDE_CITATION = re.compile("API" + r"\.md|DESIGN" + r"\.md|\.\./" + "shared")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def tracked_files() -> list[pathlib.Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.fail("tests/test_docs.py needs git and a git checkout to list the tracked files")
    return [ROOT / name for name in out.decode().split("\0") if name]


def code_spans(text: str) -> set[str]:
    """Every identifier inside a `code span` of a markdown text."""
    return {word for span in re.findall(r"`([^`]+)`", text) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {github_anchor(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_readme_is_short_and_keeps_the_two_setup_lines():
    text = README.read_text(encoding="utf-8")
    size = len(text.encode())
    assert size <= 12 * 1024, f"README.md is {size} bytes; the limit is 12 KiB (move reference material to docs/)"
    lines = text.splitlines()
    for line in SETUP_LINES:
        assert line in lines, f"README.md lost the set-up line {line!r}"


def test_no_tracked_file_cites_files_outside_the_repository():
    hits = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [
            f"{path.relative_to(ROOT)}:{n}"
            for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE_CITATION.search(line)
        ]
    assert not hits, f"cite the repository's own docs instead: {hits}"


def helpers_flags() -> set[str]:
    """Names given to ContextVar(...), getenv(...) and os.environ.get(...) as string literals in fusegrad/helpers.py."""
    tree = ast.parse((ROOT / "fusegrad" / "helpers.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        is_environ_get = (
            callee == "get" and isinstance(func, ast.Attribute) and ast.unparse(func.value).endswith("environ")
        )
        if callee in ("ContextVar", "getenv") or is_environ_get:
            names.add(node.args[0].value)
    return names


def test_every_flag_in_helpers_is_documented():
    flags = helpers_flags()
    assert {"DEBUG", "DEV", "BEAM", "XDG_CACHE_HOME"} <= flags, f"the flag scan of helpers.py misses some: {flags}"
    documented = code_spans((ROOT / "docs" / "env_vars.md").read_text(encoding="utf-8"))
    missing = sorted(flags - documented)
    assert not missing, f"flags read in fusegrad/helpers.py but missing from docs/env_vars.md: {missing}"


def test_every_flag_registered_at_runtime_is_documented():
    from fusegrad.helpers import ContextVar

    documented = code_spans((ROOT / "docs" / "env_vars.md").read_text(encoding="utf-8"))
    missing = sorted(set(ContextVar.registry) - documented)
    assert not missing, f"ContextVars missing from docs/env_vars.md: {missing}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"


def public_tensor_names() -> set[str]:
    names = set()
    for name in dir(Tensor):
        if name.startswith("_"):
            continue
        owner = next(k for k in Tensor.__mro__ if name in vars(k))
        if owner.__module__.startswith("fusegrad."):
            names.add(name)
    return names


def test_api_page_names_the_public_api():
    documented = code_spans((ROOT / "docs" / "api.md").read_text(encoding="utf-8"))
    expected = {
        "fusegrad": set(fusegrad.__all__),
        "Tensor": public_tensor_names(),
        "fusegrad.nn": {n for n, v in vars(nn).items() if inspect.isclass(v) and v.__module__ == nn.__name__},
        "fusegrad.nn.optim": set(optim.__all__),
        "fusegrad.nn.state": set(state.__all__),
        "fusegrad.nn.datasets": set(datasets.__all__),
    }
    assert len(expected["Tensor"]) > 200 and len(expected["fusegrad.nn"]) > 10, "the scan found too few names"
    missing = {where: sorted(names - documented) for where, names in expected.items() if names - documented}
    assert not missing, f"public names missing from docs/api.md: {missing}"
