#!/usr/bin/env python3
"""Checks the links of the guide (docs/book/src) and of the top-level documents, offline.

    python3 scripts/check-book-links.py

- Every page under docs/book/src is in SUMMARY.md, and every page SUMMARY.md names exists.
- A relative link names a file or directory that exists; a `#fragment` on a Markdown file
  names one of its headings (the slug GitHub and mdBook both give it).
- A book page links within the book only: a file elsewhere in the repository is linked by
  its repository address (https://github.com/idem-rs/idem/blob/main/PATH), since the built
  book holds only its own pages. Those addresses are checked against this checkout.
- Other web addresses are not fetched (CI reaches no other host); they are counted.

Why not mdbook-linkcheck2: it checks the book alone, not the README's links or the
repository addresses above, and building it adds minutes to every CI run on a bare machine.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BOOK = os.path.join(ROOT, "docs", "book", "src")
REPOSITORY = "https://github.com/idem-rs/idem/"
DOCUMENTS = ["README.md", "CHANGELOG.md", "RUNBOOK.md", "BENCHMARKS.md", "RELIABILITY.md", "docs/DESIGN.md"]

# An inline link or image, its text possibly wrapped over lines; and a reference
# definition, `[name]: target`.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s+(\S+)", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The lines outside fenced code blocks, with their numbers."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        yield number, line


def slug(heading):
    """A heading's anchor, as GitHub and mdBook make it: a link's text, lower case, letters,
    digits, `_` and `-` kept, each space a `-`, the rest dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            for _, line in prose_lines(f.read()):
                match = HEADING.match(line)
                if match:
                    base = slug(match.group(2))
                    count = seen.get(base, 0)
                    seen[base] = count + 1
                    found.add(base if count == 0 else f"{base}-{count}")
        cache[path] = found
    return cache[path]


def check_target(source, number, target, problems, counts):
    where = f"{os.path.relpath(source, ROOT)}:{number}"
    in_book = os.path.commonpath([source, BOOK]) == BOOK
    if target.startswith(REPOSITORY):
        match = re.match(r"(blob|tree)/main/([^#?]*)(?:#(.*))?$", target[len(REPOSITORY):])
        if not match:
            problems.append(f"{where}: {target}: not a blob/main or tree/main address")
            return
        path = os.path.join(ROOT, match.group(2))
        fragment = match.group(3)
        counts["repository"] += 1
    elif re.match(r"[a-z][a-z0-9+.-]*:", target):
        counts["web"] += 1
        return
    else:
        file_part, _, fragment = target.partition("#")
        path = source if not file_part else os.path.normpath(os.path.join(os.path.dirname(source), file_part))
        fragment = fragment or None
        counts["relative"] += 1
        if in_book and os.path.commonpath([path, BOOK]) != BOOK:
            problems.append(
                f"{where}: {target}: leaves the book; link {REPOSITORY}blob/main/"
                f"{os.path.relpath(path, ROOT)} instead"
            )
            return
    if not os.path.exists(path):
        problems.append(f"{where}: {target}: no such file")
        return
    if fragment is not None:
        if not path.endswith(".md"):
            problems.append(f"{where}: {target}: a fragment on a file that is not Markdown")
        elif fragment not in anchors(path):
            problems.append(f"{where}: {target}: no heading makes the anchor #{fragment}")


def main():
    problems = []
    counts = {"relative": 0, "repository": 0, "web": 0}
    pages = sorted(
        os.path.join(directory, name)
        for directory, _, names in os.walk(BOOK)
        for name in names
        if name.endswith(".md")
    )
    with open(os.path.join(BOOK, "SUMMARY.md"), encoding="utf-8") as f:
        summary = f.read()
    listed = {os.path.normpath(os.path.join(BOOK, t.partition("#")[0])) for t in LINK.findall(summary)}
    for page in pages:
        if page.endswith("SUMMARY.md"):
            continue
        if page not in listed:
            problems.append(f"{os.path.relpath(page, ROOT)}: not in SUMMARY.md, so not in the book")
    for page in listed:
        if not os.path.exists(page):
            problems.append(f"SUMMARY.md names {os.path.relpath(page, ROOT)}, which does not exist")
    readmes = sorted(
        os.path.join(ROOT, name, "README.md")
        for name in os.listdir(ROOT)
        if name.startswith("idem-") and os.path.exists(os.path.join(ROOT, name, "README.md"))
    )
    for source in pages + [os.path.join(ROOT, d) for d in DOCUMENTS] + readmes:
        with open(source, encoding="utf-8") as f:
            text = f.read()
        # The prose with code blocks blanked, so that offsets keep their line numbers and a
        # link whose text wraps over lines is still one link.
        lines = text.split("\n")
        kept = dict(prose_lines(text))
        prose = "\n".join(kept.get(number, "") for number in range(1, len(lines) + 1))
        for pattern in (LINK, DEFINITION):
            for match in pattern.finditer(prose):
                number = prose.count("\n", 0, match.start()) + 1
                check_target(source, number, match.group(1), problems, counts)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(
        f"links: {counts['relative']} relative and {counts['repository']} repository addresses "
        f"checked, {counts['web']} other web addresses not fetched; {len(problems)} broken"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
