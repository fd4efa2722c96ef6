#!/usr/bin/env python3
"""Checks that every published crate is ready for the registry, as a user or a packager
would check it first. Run from the workspace root; .ci/run runs it.

- idem-demo, idem-bench, idem-chaos and idem-guide (the book's doc tests) stay unpublished
  (publish = false).
- Every other crate has a description, a readme that exists, keywords, categories, the
  workspace's licence, a repository, docs.rs metadata, and both licence files.
- Every crate's rust-version is at least the highest rust-version its dependency tree
  (normal and build dependencies, from `cargo metadata`) declares: the declared minimum
  stays true as dependencies move.
"""
import json
import os
import subprocess
import sys

UNPUBLISHED = {"idem-demo", "idem-bench", "idem-chaos", "idem-guide"}
LICENCE = "MIT OR Apache-2.0"


def version(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    metadata = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--locked"])
    )
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}

    def closure(root):
        seen, stack = set(), [root]
        while stack:
            for dep in nodes[stack.pop()]["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds & {None, "build"} and dep["pkg"] not in seen:
                    seen.add(dep["pkg"])
                    stack.append(dep["pkg"])
        return seen

    problems = []
    for member in metadata["workspace_members"]:
        package = packages[member]
        name = package["name"]
        say = lambda what: problems.append(f"{name}: {what}")
        published = package["publish"] != []
        if name in UNPUBLISHED:
            if published:
                say("must stay unpublished (publish = false)")
            continue
        if not published:
            say(f"is not published; only {', '.join(sorted(UNPUBLISHED))} may be unpublished")
        for field in ("description", "repository", "readme"):
            if not package.get(field):
                say(f"has no {field}")
        if package.get("license") != LICENCE:
            say(f"must be licensed {LICENCE!r}")
        if not package.get("keywords"):
            say("has no keywords")
        if not package.get("categories"):
            say("has no categories")
        if "rs" not in ((package.get("metadata") or {}).get("docs") or {}):
            say("has no [package.metadata.docs.rs]")
        crate_dir = os.path.dirname(package["manifest_path"])
        readme = package.get("readme")
        if readme and not os.path.isfile(os.path.join(crate_dir, readme)):
            say(f"its readme {readme} does not exist")
        for licence_file in ("LICENSE-MIT", "LICENSE-APACHE"):
            if not os.path.isfile(os.path.join(crate_dir, licence_file)):
                say(f"does not ship {licence_file}")
        declared = package.get("rust_version")
        needed, by = (0, 0, 0), "nothing"
        for dep in closure(member):
            rv = packages[dep].get("rust_version")
            if rv and version(rv) > needed:
                needed, by = version(rv), f"{packages[dep]['name']} {packages[dep]['version']}"
        if not declared or version(declared) < needed:
            say(
                f"declares rust-version {declared}, below {'.'.join(map(str, needed))} "
                f"that {by} needs"
            )
        else:
            print(f"{name}: rust-version {declared} (its dependencies need {'.'.join(map(str, needed))}, {by})")
    if problems:
        print("packaging problems:", *problems, sep="\n  ", file=sys.stderr)
        sys.exit(1)
    print("every published crate has its metadata, licences and a true rust-version")


if __name__ == "__main__":
    main()
