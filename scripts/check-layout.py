#!/usr/bin/env python3
"""The layout rules of the tree, checked from the sources.

1. No module import circle inside a crate: with one node per source file, an edge
   A -> B when A names an item of B (`crate::b::..`, `super::..`, `self::..`, or a child
   module `b::..` of A; a re-export, `pub use`, is not a use), no two files reach each
   other. The crate root (lib.rs, main.rs)
   is where modules are assembled and re-exported, so it is left out of the graph.
2. No product crate depends on the test web server, the load generator or the lab
   (only the `farside` binary, which runs them as subcommands, and the lab itself may).
3. Size: no source file over 1,500 lines, no lab file over 1,000.

Prints what breaks a rule and exits 1; prints a summary line and exits 0 otherwise.
Usage: scripts/check-layout.py [--sizes-only|--no-sizes]
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CRATES = os.path.join(ROOT, "crates")
NOT_PRODUCT = {"farside-backend", "farside-loadgen", "farside-lab"}
MAY_DEPEND_ON_THEM = {"farside", "farside-lab", "farside-loadgen", "farside-backend"}
FILE_LINES_MAX = 1500
LAB_FILE_LINES_MAX = 1000

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text):
    """Source text with comments, string and char literals blanked (lines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_modules(text):
    """Text without the bodies of `#[cfg(test)] mod x { .. }` blocks: tests may name
    any module of their crate without making a circle of the product's modules."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+" + IDENT + r"\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += text[j] == "{"
            depth -= text[j] == "}"
            j += 1
        out.append("\n" * text.count("\n", m.start(), j))
        i = j
    out.append(text[i:])
    return "".join(out)


def crate_modules(src):
    """Map module path (tuple) -> file, for every file module of a crate's src/."""
    mods = {}
    for root in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, root)):
            mods[()] = os.path.join(src, root)
            break
    else:
        return mods
    todo = [()]
    while todo:
        path = todo.pop()
        f = mods[path]
        text = strip_comments_and_strings(open(f).read())
        base = os.path.dirname(f)
        stem = os.path.basename(f)[:-3]
        if stem not in ("lib", "main", "mod"):
            base = os.path.join(base, stem)
        for m in re.finditer(r"(?:#\[path\s*=\s*\"[^\"]*\"\]\s*)?\bmod\s+(" + IDENT + r")\s*;", text):
            name = m.group(1)
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    mods[path + (name,)] = cand
                    todo.append(path + (name,))
                    break
    return mods


def use_paths(text):
    """Every path written in `use` trees and every `a::b` path expression, as lists."""
    paths = []
    for m in re.finditer(r"(\bpub(?:\([a-z]+\))?\s+)?\buse\s+([^;]+);", text):
        # A re-export (`pub use child::Item`) names the item for the module's users; it
        # is not a use of it, so a facade over its children makes no circle.
        if m.group(1) is None:
            paths.extend(expand_use(m.group(2).replace("\n", " ")))
    body = re.sub(r"\buse\s+[^;]+;", " ", text)
    for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r"::)+" + IDENT + r")", body):
        paths.append(m.group(1).split("::"))
    return paths


def expand_use(tree):
    tree = tree.strip()
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    if tree.startswith("::"):
        tree = tree[2:]
    if "{" not in tree:
        return [[p.strip() for p in tree.split("::") if p.strip()]]
    i = tree.index("{")
    prefix = [p.strip() for p in tree[:i].split("::") if p.strip()]
    inner = tree[i + 1:tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            for sub in expand_use(p):
                out.append(prefix + sub)
    if not out:
        out.append(prefix)
    return out


def resolve(path, here, mods):
    """The file module that `path`, written in module `here`, names (or None)."""
    if not path:
        return None
    head = path[0]
    if head == "crate":
        abs_ = list(path[1:])
    elif head == "super":
        cur = list(here)
        rest = list(path)
        while rest and rest[0] == "super":
            if not cur:
                return None
            cur.pop()
            rest.pop(0)
        abs_ = cur + rest
    elif head == "self":
        abs_ = list(here) + list(path[1:])
    elif tuple(here) + (head,) in mods:
        abs_ = list(here) + list(path)
    else:
        return None
    best = None
    for k in range(len(abs_), 0, -1):
        if tuple(abs_[:k]) in mods:
            best = tuple(abs_[:k])
            break
    return best


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def crate_name(d):
    m = re.search(r'^name\s*=\s*"([^"]+)"', open(os.path.join(d, "Cargo.toml")).read(), re.M)
    return m.group(1) if m else os.path.basename(d)


def normal_deps(d):
    text = open(os.path.join(d, "Cargo.toml")).read()
    deps, section = set(), None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("["):
            section = s.strip("[]")
            continue
        if section == "dependencies":
            m = re.match(r"([A-Za-z0-9_-]+)\s*(=|\.)", s)
            if m:
                deps.add(m.group(1))
    return deps


def main():
    args = set(sys.argv[1:])
    problems = []
    files_total = edges_total = 0
    for c in sorted(os.listdir(CRATES)):
        d = os.path.join(CRATES, c)
        if not os.path.exists(os.path.join(d, "Cargo.toml")):
            continue
        name = crate_name(d)
        if "--sizes-only" not in args:
            bad = sorted(normal_deps(d) & NOT_PRODUCT)
            if bad and name not in MAY_DEPEND_ON_THEM:
                problems.append(f"{name}: a product crate depends on {', '.join(bad)}")
            mods = crate_modules(os.path.join(d, "src"))
            graph = {}
            for path, f in mods.items():
                if path == ():
                    continue
                text = strip_test_modules(strip_comments_and_strings(open(f).read()))
                for p in use_paths(text):
                    t = resolve(p, path, mods)
                    if t is not None and t != path and t != ():
                        graph.setdefault(path, set()).add(t)
                graph.setdefault(path, set())
            files_total += len(graph)
            edges_total += sum(len(v) for v in graph.values())
            for comp in cycles(graph):
                names = ["/".join(m) for m in comp]
                problems.append(f"{name}: module import circle: {' <-> '.join(names)}")
        if "--no-sizes" not in args:
            for root, _, fs in os.walk(d):
                if "/target" in root:
                    continue
                for fn in fs:
                    if fn.endswith(".rs"):
                        p = os.path.join(root, fn)
                        n = sum(1 for _ in open(p))
                        bound = LAB_FILE_LINES_MAX if name == "farside-lab" else FILE_LINES_MAX
                        if n > bound:
                            problems.append(f"{os.path.relpath(p, ROOT)}: {n} lines (bound {bound})")
    for p in problems:
        print(p)
    if problems:
        print(f"check-layout: {len(problems)} problems")
        return 1
    print(f"check-layout: no circle among {files_total} modules ({edges_total} imports), "
          f"no product crate links a test server or the lab, no file over its bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
