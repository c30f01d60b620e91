#!/usr/bin/env python3
"""Every relative link of the project's documents resolves inside the repository.

A user has the repository and nothing beside it: a link to a path outside it, to a file that does
not exist, or to a heading that a file does not have, leaves them stuck. Checked here, for the
README, every Markdown file under docs/ and the TypeScript client's README:

- inline links and images, [text](target) and ![alt](target), and reference definitions,
  [label]: target; links inside code (fenced blocks, `code spans`) are text, not links;
- a target with a scheme (https:, mailto:) is left alone: it is not the repository's;
- a relative target must stay inside the repository and name a file or directory that exists;
- a document that is shipped alone (the TypeScript client's README, which `npm pack` puts in the
  package and the npm page shows) links only inside its package directory: its reader has the
  package, not the repository;
- a #anchor must be a heading of the target Markdown file (or of the same file for a bare
  #anchor), as GitHub makes its anchors: lower case, punctuation dropped, spaces as hyphens, and
  -1, -2 ... for a heading that comes again.

Usage: check_links.py REPOSITORY_ROOT. Exit code 0 when every link resolves, 1 otherwise, with
one line per bad link (file:line: the link and what is wrong). check_links.py --self-test runs the
checker on a small repository it makes, with links that must pass and links that must fail.
"""

import os
import re
import sys
import tempfile
import unicodedata
import urllib.parse


def documents(root):
    """The files whose links are checked, relative to the root."""
    out = ["README.md", os.path.join("clients", "typescript", "README.md")]
    for dirpath, _, names in os.walk(os.path.join(root, "docs")):
        for name in sorted(names):
            if name.endswith(".md"):
                out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


# Documents shipped in a package of their own, and that package's directory.
PACKAGED = {os.path.join("clients", "typescript", "README.md"): os.path.join("clients", "typescript")}

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")


def prose_lines(text, blank_code=True):
    """(line number, line) for each line outside fenced code blocks, code spans blanked unless
    told otherwise (a heading's anchor keeps their text)."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        yield number, blank_code_spans(line) if blank_code else line


def blank_code_spans(line):
    """The line with every `code span` replaced by spaces (a backtick run closes on its twin)."""
    out = []
    i = 0
    while i < len(line):
        if line[i] != "`":
            out.append(line[i])
            i += 1
            continue
        run = len(line[i:]) - len(line[i:].lstrip("`"))
        ticks = "`" * run
        end = line.find(ticks, i + run)
        while end != -1 and line[end + run : end + run + 1] == "`":
            end = line.find(ticks, end + run + 1)
        if end == -1:
            out.append(ticks)
            i += run
            continue
        out.append(" " * (end + run - i))
        i = end + run
    return "".join(out)


INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links(text):
    """(line number, target) for every link of a document."""
    for number, line in prose_lines(text):
        for m in INLINE.finditer(line):
            yield number, m.group(1).strip("<>")
        m = REFERENCE.match(line)
        if m:
            yield number, m.group(1).strip("<>")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "")
    out = []
    for ch in text.lower():
        if ch in " -":
            out.append("-")
        elif ch == "_" or ch.isalnum() or unicodedata.category(ch).startswith("M"):
            out.append(ch)
    return "".join(out)


def anchors(text):
    """Every anchor the headings of a Markdown document give."""
    seen = {}
    out = set()
    for _, line in prose_lines(text, blank_code=False):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def check(root):
    root = os.path.realpath(root)
    texts = {}

    def text_of(path):
        if path not in texts:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
        return texts[path]

    problems = []
    checked = 0
    for doc in documents(root):
        doc_path = os.path.join(root, doc)
        if not os.path.isfile(doc_path):
            problems.append(f"{doc}: the document is missing")
            continue
        for number, target in links(text_of(doc_path)):
            checked += 1
            where = f"{doc}:{number}: ({target})"
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            path, _, anchor = (urllib.parse.unquote(part) for part in target.partition("#"))
            if not path:
                path = os.path.basename(doc)  # #anchor: a heading of this document
            if path.startswith("/"):
                problems.append(f"{where}: an absolute path; link relative to the document")
                continue
            resolved = os.path.realpath(os.path.join(os.path.dirname(doc_path), path))
            if resolved != root and not resolved.startswith(root + os.sep):
                problems.append(f"{where}: leaves the repository")
                continue
            package = PACKAGED.get(doc)
            if package is not None:
                package_root = os.path.join(root, package)
                if resolved != package_root and not resolved.startswith(package_root + os.sep):
                    problems.append(f"{where}: leaves the package {package}/ (its README is "
                                    "shipped alone: name the file in prose, or link it by URL)")
                    continue
            if not os.path.exists(resolved):
                problems.append(f"{where}: no such file in the repository")
                continue
            if not anchor:
                continue
            if not resolved.endswith(".md") or not os.path.isfile(resolved):
                problems.append(f"{where}: an anchor into a file that is not Markdown")
                continue
            if anchor not in anchors(text_of(resolved)):
                problems.append(
                    f"{where}: {os.path.relpath(resolved, root)} has no heading #{anchor}")
    return checked, problems


def self_test():
    """The checker on a repository of its own: each good link passes, each bad one is found."""
    files = {
        "README.md": "\n".join([
            "# Title",
            "[a doc](docs/a.md), [its heading](docs/a.md#the-api-v1), [a dir](docs/)",
            "[again](docs/a.md#the-api-v1-1), [here](#title), [web](https://example.com/x)",
            "[bad file](docs/nope.md)",                # 4: missing
            "[bad anchor](docs/a.md#nope)",            # 5: no such heading
            "[outside](../elsewhere.md)",              # 6: leaves the repository
            "`[in code](docs/nope.md)` and",
            "```",
            "[fenced](docs/nope.md)",
            "```",
            "[ref]: docs/missing.md",                  # 11: missing
            "[spaced](docs/b%20c.md#under_score-and-%C3%A9migr%C3%A9)",
            "[star](docs/a.md#étoile-x)",
        ]),
        "clients/typescript/README.md": "\n".join([
            "[up](../../docs/a.md#étoile-x)",          # 1: leaves the package
            "[up2](../../../x.md)",                    # 2: leaves the repository
            "[inside](package.json), [here](#c)",
            "# C",
        ]),
        "clients/typescript/package.json": "{}\n",
        "docs/a.md": "# The API (v1)\n## `The` API, v1\n### Étoile: X\n",
        "docs/b c.md": "## Under_score and émigré\n",
    }
    want = {
        "README.md:4: (docs/nope.md): no such file in the repository",
        "README.md:5: (docs/a.md#nope): docs/a.md has no heading #nope",
        "README.md:6: (../elsewhere.md): leaves the repository",
        "README.md:11: (docs/missing.md): no such file in the repository",
        "clients/typescript/README.md:1: (../../docs/a.md#étoile-x): leaves the package "
        "clients/typescript/ (its README is shipped alone: name the file in prose, or link it by "
        "URL)",
        "clients/typescript/README.md:2: (../../../x.md): leaves the repository",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "repo")
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        with open(os.path.join(tmp, "elsewhere.md"), "w", encoding="utf-8") as f:
            f.write("# outside, but present\n")
        checked, problems = check(root)
    got = set(problems)
    if got != want or checked != 16:
        print(f"self-test failed: {checked} links checked (16 expected)")
        for p in sorted(want - got):
            print(f"  not found: {p}")
        for p in sorted(got - want):
            print(f"  found, but should pass: {p}")
        return 1
    print(f"self-test: {len(want)} bad links found, {checked - len(want)} good ones passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print("usage: check_links.py REPOSITORY_ROOT", file=sys.stderr)
        return 2
    checked, problems = check(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} of {checked} links do not resolve inside the repository")
        return 1
    print(f"{checked} links checked; every one resolves inside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
