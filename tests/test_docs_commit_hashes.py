"""Docs say what is true now and the command that shows it: no doc under ``docs/`` and not the README names a commit
of this repository (history belongs in git and CHANGELOG.md).

A word of 7 to 40 hexadecimal digits (with a digit and a letter) is a commit hash when ``git cat-file`` resolves it
to a commit of this checkout. Without git or outside a clone (a source tarball) the test skips, saying so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_HEX = re.compile(r"(?<![0-9A-Za-z_/.-])[0-9a-f]{7,40}(?![0-9A-Za-z_])")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commit_hashes(text: str, repo: Path = ROOT) -> set[str]:
    """The words of ``text`` that name a commit of the git repository at ``repo``."""
    words = sorted({w for w in _HEX.findall(text) if re.search(r"\d", w) and re.search(r"[a-f]", w)})
    if not words:
        return set()
    out = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], input="\n".join(words) + "\n",
                         capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    return {w for w, line in zip(words, out) if line.split()[1:2] == ["commit"]}


def _git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True, text=True)
    return r.returncode == 0


needs_git = pytest.mark.skipif(not _git_checkout(), reason="needs git and a clone of the repository (a source "
                                                            "tarball has no commits to look the words up in)")


@needs_git
def test_the_check_finds_a_commit_hash_in_a_scratch_text() -> None:
    """The detector itself: a scratch text naming HEAD (short and full) is caught; hex words that are not
    commits of this repository (a checksum, a colour, a word) are not."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    scratch = (f"Before is commit {head[:7]} (`git archive {head[:9]}`), full {head}.\n"
               "A SHA-256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef, colour #a1b2c3, "
               "the word deadbee and 1234567.\n")
    assert commit_hashes(scratch) == {head[:7], head[:9], head}


@needs_git
def test_no_doc_names_a_commit_of_this_repository() -> None:
    found = {str(p.relative_to(ROOT)): sorted(h) for p in _docs() if (h := commit_hashes(p.read_text()))}
    assert not found, (f"docs name commits of this repository: {found}; say what is true now and the command that "
                       "shows it (history belongs in git and CHANGELOG.md)")
