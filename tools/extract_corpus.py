#!/usr/bin/env python3
"""Extract the demo model's training corpus from the Python 3.11 documentation.

The text comes from the HTML documentation that Debian's ``python3.11-doc`` package installs
under /usr/share/doc/python3.11/html (Python 3.11.2; the Python documentation is distributed
under the PSF License Agreement, its code examples also under the Zero-Clause BSD licence;
see docs/demo-model.md). Only the standard library is used (html.parser).

What is kept: the main content of every page (``<div class="body" role="main">``) as plain
text. Paragraphs, headings, list items and definition terms become paragraphs separated by a
blank line, with runs of whitespace inside them collapsed to one space; ``<pre>`` blocks (code
and interactive sessions) are kept verbatim, indentation included, with trailing spaces
removed; list items start with "- " (indented two spaces per nesting level); table cells are
joined with " | ", one paragraph per row. Permalink markers ("¶"), scripts and navigation are
dropped. Index, search and table-of-contents pages are skipped.

Output (``--out``, default ``corpus/``):
  train.txt    the training documents
  heldout.txt  the held-out documents: every 50th page of the kept pages in path order,
               starting with the 11th (position % 50 == 10): 2 % of the documents
  manifest.json  the page list of each split and the sizes

Within both text files, documents are separated by a line holding only a form feed (U+000C);
a document's first paragraph is its page title. ``--max-mb`` caps train.txt by dropping whole
training documents, largest first, if the text would be larger.

Usage: python3 tools/extract_corpus.py [--html DIR] [--out corpus] [--max-mb 36]
"""

import argparse
import html.parser
import json
import os
import re
import sys

DEFAULT_HTML = "/usr/share/doc/python3.11/html"
DOC_SEPARATOR = "\n\x0c\n"
HELDOUT_MODULUS = 50
HELDOUT_RESIDUE = 10

SKIP_PAGES = re.compile(r"^(genindex.*|py-modindex|search|contents)\.html$")
SKIP_DIRS = ("_static", "_sources", "_downloads", "_images")

BLOCK_TAGS = {
    "p", "div", "section", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "dl",
    "ul", "ol", "blockquote", "table", "caption", "hr", "figure", "figcaption", "aside",
    "tr", "thead", "tbody", "header", "footer", "nav", "article", "main", "details",
    "summary", "center",
}
# Elements whose text is never wanted.
DROP_TAGS = {"script", "style", "head", "title", "noscript", "button", "form", "input"}
VOID_TAGS = {"br", "hr", "img", "input", "meta", "link", "wbr", "area", "base", "col",
             "embed", "param", "source", "track"}
WS = re.compile(r"\s+")


class MainTextParser(html.parser.HTMLParser):
    """Collects the blocks of text inside the page's main body div."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks = []  # finished paragraphs (strings)
        self.buf = []  # pieces of the current inline paragraph
        self.stack = []  # open elements: (tag, flags)
        self.in_main = 0  # > 0 while inside the main body div (its nesting depth)
        self.drop = 0  # > 0 while inside an element that is dropped entirely
        self.pre = 0  # > 0 while inside <pre>
        self.pre_buf = []
        self.table = 0  # > 0 while inside a table: paragraphs there stay inline
        self.list_depth = 0
        self.prefix = ""  # pending list-item prefix for the next paragraph

    # -- paragraph management -------------------------------------------------------------
    def flush(self):
        text = WS.sub(" ", "".join(self.buf)).strip()
        self.buf = []
        if text:
            self.blocks.append(self.prefix + text)
            self.prefix = ""

    def flush_pre(self):
        raw = "".join(self.pre_buf)
        self.pre_buf = []
        lines = [line.rstrip() for line in raw.replace("\r\n", "\n").split("\n")]
        while lines and not lines[0]:
            lines.pop(0)
        while lines and not lines[-1]:
            lines.pop()
        if lines:
            if self.prefix:  # a list item that starts with code: keep the marker alone
                self.blocks.append(self.prefix.rstrip())
                self.prefix = ""
            self.blocks.append("\n".join(lines))

    # -- parser callbacks -----------------------------------------------------------------
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag in VOID_TAGS:
            if self.in_main and not self.drop:
                if tag == "br":
                    (self.pre_buf if self.pre else self.buf).append("\n" if self.pre else " ")
                elif tag == "hr" and not self.table:
                    self.flush()
            return
        flags = set()
        if not self.in_main:
            if tag == "div" and "body" in classes and a.get("role") == "main":
                flags.add("main")
                self.in_main = 1
            self.stack.append((tag, flags))
            return
        if tag == "div":
            self.in_main += 1
            flags.add("div")
        if self.drop or tag in DROP_TAGS or (tag == "a" and "headerlink" in classes):
            flags.add("drop")
            self.drop += 1
            self.stack.append((tag, flags))
            return
        if tag == "pre":
            if not self.table:
                self.flush()
            self.pre += 1
            flags.add("pre")
        elif self.pre:
            pass  # markup inside <pre> (highlighting spans) is inline
        elif tag == "table":
            if not self.table:
                self.flush()
            self.table += 1
            flags.add("table")
        elif self.table:
            if tag == "tr":
                self.flush()
            elif tag in ("td", "th"):
                if "".join(self.buf).strip():
                    self.buf.append(" | ")
            elif tag in BLOCK_TAGS:
                self.buf.append(" ")
        elif tag in ("ul", "ol"):
            self.flush()
            self.list_depth += 1
            flags.add("list")
        elif tag == "li":
            self.flush()
            self.prefix = "  " * max(self.list_depth - 1, 0) + "- "
        elif tag in BLOCK_TAGS:
            self.flush()
        self.stack.append((tag, flags))

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        # Pop up to the matching element (tolerates unclosed inline tags).
        idx = len(self.stack) - 1
        while idx >= 0 and self.stack[idx][0] != tag:
            idx -= 1
        if idx < 0:
            return
        while len(self.stack) > idx:
            t, flags = self.stack.pop()
            self._close(t, flags)

    def _close(self, tag, flags):
        if "div" in flags:
            self.in_main -= 1
        if "main" in flags:
            self.flush()
            self.in_main = 0
            return
        if "drop" in flags:
            self.drop -= 1
            return
        if not self.in_main or self.drop:
            return
        if "pre" in flags:
            self.pre -= 1
            if not self.pre:
                if self.table:
                    self.buf.append(" " + " ".join("".join(self.pre_buf).split()) + " ")
                    self.pre_buf = []
                else:
                    self.flush_pre()
        elif self.pre:
            pass
        elif "table" in flags:
            self.table -= 1
            if not self.table:
                self.flush()
        elif self.table:
            if tag == "tr":
                self.flush()
        elif "list" in flags:
            self.flush()
            self.list_depth -= 1
            self.prefix = ""
        elif tag in BLOCK_TAGS:
            self.flush()

    def handle_data(self, data):
        if not self.in_main or self.drop:
            return
        if self.pre:
            self.pre_buf.append(data)
        else:
            self.buf.append(data)


def page_text(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    parser = MainTextParser()
    parser.feed(source)
    parser.close()
    parser.flush()
    text = "\n\n".join(parser.blocks)
    text = text.replace("\x0c", " ").replace("\u00b6", "")
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--html", default=DEFAULT_HTML, help="root of the HTML documentation")
    ap.add_argument("--out", default="corpus", help="output directory")
    ap.add_argument("--max-mb", type=float, default=36.0,
                    help="upper bound on train.txt in MB (whole documents are dropped)")
    ap.add_argument("--min-chars", type=int, default=200,
                    help="skip pages with less text than this")
    args = ap.parse_args()

    if not os.path.isdir(args.html):
        sys.exit(f"error: {args.html} not found (apt-get install python3.11-doc)")
    pages = []
    for root, dirs, files in os.walk(args.html):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if not name.endswith(".html"):
                continue
            rel = os.path.relpath(os.path.join(root, name), args.html).replace(os.sep, "/")
            if SKIP_PAGES.match(rel):
                continue
            pages.append(rel)
    pages.sort()

    kept, skipped = [], []
    for rel in pages:
        text = page_text(os.path.join(args.html, rel))
        if len(text) < args.min_chars:
            skipped.append(rel)
        else:
            kept.append((rel, text))
    train, heldout = [], []
    for i, doc in enumerate(kept):
        (heldout if i % HELDOUT_MODULUS == HELDOUT_RESIDUE else train).append(doc)

    # Size cap: drop the largest training documents first until train.txt fits.
    limit = int(args.max_mb * 1e6)
    size = sum(len(t.encode("utf-8")) + len(DOC_SEPARATOR) for _, t in train)
    dropped = []
    if size > limit:
        for rel, text in sorted(train, key=lambda rt: -len(rt[1])):
            if size <= limit:
                break
            size -= len(text.encode("utf-8")) + len(DOC_SEPARATOR)
            dropped.append(rel)
        train = [(r, t) for r, t in train if r not in set(dropped)]

    os.makedirs(args.out, exist_ok=True)
    sizes = {}
    for name, docs in (("train.txt", train), ("heldout.txt", heldout)):
        data = DOC_SEPARATOR.join(t for _, t in docs) + "\n"
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(data)
        sizes[name] = len(data.encode("utf-8"))
    manifest = {
        "source": "Debian package python3.11-doc, " + args.html.rstrip("/").split("/")[-1]
                  + " (Python 3.11.2 documentation)",
        "licence": "PSF License Agreement (documentation); code examples also Zero-Clause BSD",
        "document_separator": "a line holding only U+000C (form feed)",
        "heldout_rule": f"position in the sorted list of kept pages % {HELDOUT_MODULUS} == "
                        f"{HELDOUT_RESIDUE}",
        "bytes": sizes,
        "train_pages": [r for r, _ in train],
        "heldout_pages": [r for r, _ in heldout],
        "skipped_short_pages": skipped,
        "dropped_for_size": dropped,
    }
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"pages: {len(train)} train, {len(heldout)} held out, {len(skipped)} skipped "
          f"(short), {len(dropped)} dropped (size); train.txt {sizes['train.txt'] / 1e6:.2f} MB, "
          f"heldout.txt {sizes['heldout.txt'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
