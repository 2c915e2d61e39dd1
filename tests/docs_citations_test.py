#!/usr/bin/env python3
"""docs_citations_test: the repository cites its own docs/, and only what exists there.

Fails when
  (a) a git-tracked file, of any kind, names the design document that used to live outside the
      repository (the name is assembled below, so that this file does not contain it);
  (b) a tracked text file cites docs/<page>.md and that page does not exist;
  (c) a citation names a numbered section that the cited page does not have.

Citation forms (docs/design.md, "Citing"): a page path followed by section numbers, each
written with the section sign or the word "section", several joined by commas or "and":
docs/<page>.md, then e.g. "§4", "§4.3, §5", "section 4.3". Inside docs/, a section sign that
follows no page path refers to the page it is written in, and <page>.md without the docs/
prefix, when followed by section numbers, to that sibling page. A citation may continue on
the next line of a comment: line breaks with "//", "#", "*" or "--" leaders count as spaces.

A page has section N when one of its headings starts with N: "## 4. Title", "### 4.3 Title".

Usage: docs_citations_test.py [REPO_ROOT]   (default: the folder above this script's)
Exit status 0 when every check passes, 1 otherwise (each problem printed as FILE:LINE: ...).
"""

import bisect
import os
import re
import subprocess
import sys

FORBIDDEN = ("DESIGN" + ".md").encode()

# A heading that starts with a section number; group 1 is the number ("4", "4.3").
HEADING = re.compile(r"^#{1,6}[ \t]+(\d+(?:\.\d+)*)\.?(?=[ \t]|$)", re.M)
NUMBER = r"\d+(?:\.\d+)*"
SECTION_REF = re.compile(r"(?:§|\bsection\s+)\s*(" + NUMBER + r")")
# A page path, then any section numbers that follow it.
CITATION = re.compile(
    r"(?<![\w./-])(docs/)?([A-Za-z0-9_-]+)\.md(?![\w-])"
    r"((?:\s*(?:,|\band\b)?\s*(?:§|\bsection\s+)\s*" + NUMBER + r")*)")
# A line break plus the comment leader of the next line: read as one space, so that a
# citation wrapped in a comment still reads as one.
LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*(?:(?://+|#+|\*+|--)(?=[ \t§]|$))?[ \t]*", re.M)


def tracked_files(root):
    """Paths (relative to root) of the files git tracks; every file when root is no checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"note: not a git checkout ({e}); checking every file but .git and build*/")
    paths = []
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        dirs[:] = [d for d in dirs
                   if d != ".git" and not (rel == "." and d.startswith("build"))]
        paths += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return paths


class Pages:
    """The numbered sections of docs/ pages, read on first use."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def sections(self, page):
        """The section numbers of docs/<page>.md, or None when the page does not exist."""
        if page not in self.cache:
            path = os.path.join(self.root, "docs", page + ".md")
            if not os.path.isfile(path):
                self.cache[page] = None
            else:
                with open(path, encoding="utf-8", errors="replace") as f:
                    self.cache[page] = set(HEADING.findall(f.read()))
        return self.cache[page]


def check_citations(rel, text, pages, problems):
    in_docs = os.path.dirname(rel) == "docs" and rel.endswith(".md")
    own_page = os.path.basename(rel)[:-3] if in_docs else None
    # The text with every line break (and the next line's comment leader) read as one
    # space; breaks[i] is where original line i + 2 starts in it.
    pieces, breaks, pos, size = [], [], 0, 0
    for m in LINE_BREAK.finditer(text):
        pieces += [text[pos:m.start()], " "]
        size += m.start() - pos + 1
        breaks.append(size)
        pos = m.end()
    pieces.append(text[pos:])
    flat = "".join(pieces)

    def line_of(offset):
        return 1 + bisect.bisect_right(breaks, offset)

    covered = []
    for m in CITATION.finditer(flat):
        prefixed, page, refs = m.group(1), m.group(2), m.group(3)
        if not prefixed and not (in_docs and refs):
            continue  # README.md, RESULTS.md, ...: not a docs/ citation
        covered.append((m.start(3), m.end(3)))
        have = pages.sections(page)
        where = f"{rel}:{line_of(m.start())}"
        if have is None:
            problems.append(f"{where}: cites docs/{page}.md, which does not exist")
            continue
        for n in SECTION_REF.findall(refs):
            if n not in have:
                problems.append(f"{where}: cites docs/{page}.md §{n}, which has no such section")
    if not in_docs:
        return
    have = pages.sections(own_page)
    for m in SECTION_REF.finditer(flat):
        if m.group(0).startswith("§") and not any(a <= m.start() < b for a, b in covered):
            if m.group(1) not in have:
                problems.append(f"{rel}:{line_of(m.start())}: refers to §{m.group(1)}, "
                                f"which {rel} does not have")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    pages = Pages(root)
    problems = []
    files = tracked_files(root)
    for rel in files:
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue  # deleted in the working tree
        with open(path, "rb") as f:
            data = f.read()
        at = data.find(FORBIDDEN)
        while at >= 0:
            line = data.count(b"\n", 0, at) + 1
            problems.append(f"{rel}:{line}: names {FORBIDDEN.decode()}, a document outside the "
                            "repository; cite the page of docs/ that holds the fact")
            at = data.find(FORBIDDEN, at + 1)
        in_docs = os.path.dirname(rel) == "docs" and rel.endswith(".md")
        if b"\0" in data or not (in_docs or b"docs/" in data):
            continue  # binary, or no citation of docs/ possible
        check_citations(rel, data.decode("utf-8", errors="replace"), pages, problems)
    for p in problems:
        print(p)
    print(f"{len(files)} files checked: "
          + (f"{len(problems)} problem(s)" if problems else "citations OK"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
