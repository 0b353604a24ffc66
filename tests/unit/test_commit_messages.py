"""Commit subjects in the ecosystem's convention: at most 72 characters, the why in the body.

`git log` of the commits made after `BASE` (older history is exempt: it was written before the
convention was adopted). A merge commit's default subject ("Merge branch …") is git's own and may be
longer. Skipped, with the reason, where there is no git or no history to read: an export without
`.git`, or a shallow clone that does not reach `BASE`.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the last commit written before the convention; its descendants are checked
BASE = "11dbd16416aa9b87e028dfe29c123430c0f9cf27"
SUBJECT_LIMIT = 72


def _git(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, timeout=60,
                          check=False)


def commits_since(base: str) -> list[tuple[str, str, int]]:
    """(short hash, subject, number of parents) of each commit reachable from HEAD and not from `base`."""
    if shutil.which("git") is None:
        pytest.skip("no git on this machine: the commit history cannot be read")
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: there is no commit history to read")
    if _git("cat-file", "-e", f"{base}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        pytest.skip(f"the history does not reach {base[:12]}" + (" (a shallow clone)" if shallow else ""))
    listed = _git("log", "--format=%h%x00%s%x00%p", f"{base}..HEAD")
    assert listed.returncode == 0, listed.stderr
    commits = []
    for line in listed.stdout.splitlines():
        short, subject, parents = line.split("\x00")
        commits.append((short, subject, len(parents.split())))
    return commits


def long_subjects(commits: list[tuple[str, str, int]], limit: int = SUBJECT_LIMIT) -> list[str]:
    """`hash (length): subject` of each commit whose subject is over `limit`, merges with git's subject aside."""
    return [f"{short} ({len(subject)}): {subject}" for short, subject, parents in commits
            if len(subject) > limit and not (parents > 1 and subject.startswith("Merge "))]


def test_commit_subjects_are_at_most_72_characters() -> None:
    assert long_subjects(commits_since(BASE)) == [], (
        "commit subjects over 72 characters: reword them (git rebase -i, or git commit --amend for the last one) "
        "with the why in the body")


def test_a_long_subject_is_found_and_a_default_merge_subject_is_not() -> None:
    merge = "Merge remote-tracking branch 'origin/a-branch-with-a-long-name' into another-branch-with-a-long-name"
    commits = [("a1", "Sum report periods from stored counters", 1), ("b2", "x" * 73, 1), ("c3", merge, 2),
               ("d4", "y" * 72, 1), ("e5", "Merge " + "z" * 80, 1)]
    assert long_subjects(commits) == [f"b2 (73): {'x' * 73}", f"e5 (86): Merge {'z' * 80}"]
