#!/usr/bin/env python3
"""Compiles the C++ blocks of loom's pages (docs/testing.md, "Every C++ block compiles").

Every fenced block tagged ```cpp (or c++) in the pages given (README.md and docs/*.md) is
compiled, unless the line just before its fence is a marker, an HTML comment that does not
render:

  <!-- doc-block: no-compile "REGEX" -->  must fail to compile, its first error matching REGEX
  <!-- doc-block: skip (REASON) -->       not compiled (say why); counted and printed
  <!-- doc-block: NAME=VALUE ... -->      compiled, NAME taken from the harness's VALUE

A block is cut, at brace depth 0, into includes (hoisted to the top of the page's file),
namespace definitions, explicit specializations and BOOST_HANA_ADAPT_* (global scope), other
declarations (types, templates, functions, aliases, static_assert: the block's own namespace)
and statements (the body of a function in that namespace). A name the statements use without
declaring it, and that tests/docs/harness.hpp lists in loom_doc::values (an object of that
type) or loom_doc::types (a type), is declared for them by a prelude; the functions the pages
leave to the reader (make_model, loss_fn, ...) are loom_doc::functions.

  extract_blocks.py generate --out-dir DIR [--without LIB]... PAGE...
      writes DIR/<page id>.cpp for each page: the compiled blocks, each registering itself, so
      that the program they are linked into lists them (tests/docs/main.cpp).
  extract_blocks.py check --program EXE [--without LIB]... [--probe-file F --build-dir B
                    --probe-target T --cmake CMAKE] PAGE...
      runs EXE and compares its list with the pages as they are now; compiles every no-compile
      block (through the probe target, whose source includes F) and requires its error; prints
      the blocks of each kind per page. Fails on any difference, or when no block compiled.
  extract_blocks.py list PAGE...          prints each block, its kind and what it was cut into.

--root is the repository (paths are printed relative to it); --harness the harness header.
LIB (dist, tensorboard) is a library this build lacks: a block that needs it is left out
and counted as such.
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys

CPP_TAGS = {"cpp", "c++", "cxx"}
NEEDS = {
    # A block that names these needs the library to link.
    "dist": re.compile(r"\b(Ddp|Zero|DdpOptions|ZeroOptions|CommHook)\b|\bloom::dist::|\bc10d::"),
    "tensorboard": re.compile(r"\bTensorBoardLogger\b"),
}
KEYWORDS_BEFORE_USE = {
    "return", "co_return", "co_yield", "co_await", "throw", "else", "case", "goto", "new",
    "delete", "sizeof", "alignof", "decltype", "typeid", "not", "and", "or", "do",
}
CONTROL = {"for", "if", "while", "switch", "do", "else", "try", "catch", "return", "{", "["}


class Failure(Exception):
    pass


# ---- the pages ----------------------------------------------------------------------------------

class Block:
    def __init__(self, page, line, code, marker):
        self.page = page      # path relative to the root
        self.line = line      # 1-based line of the opening fence
        self.code = code      # the lines between the fences, the fence's indentation removed
        self.kind = "compile"
        self.reason = ""
        self.expect = ""
        self.bind = {}        # NAME -> harness value
        self.needs = []
        if marker is not None:
            self.parse_marker(marker)

    @property
    def first_line(self):  # the first line of the code
        return self.line + 1

    @property
    def digest(self):
        return hashlib.sha1("\n".join(self.code).encode()).hexdigest()[:12]

    def where(self):
        return f"{self.page}:{self.line}"

    def parse_marker(self, text):
        rest = text.strip()
        if rest.startswith("no-compile"):
            m = re.fullmatch(r'no-compile\s+"(.+)"', rest)
            if not m:
                raise Failure(f'{self.where()}: write <!-- doc-block: no-compile "REGEX" -->, '
                              f"REGEX the error the compiler must give")
            self.kind, self.expect = "no-compile", m.group(1)
            return
        if rest.startswith("skip"):
            m = re.fullmatch(r"skip\s+\((.+)\)", rest)
            if not m:
                raise Failure(f"{self.where()}: write <!-- doc-block: skip (REASON) -->")
            self.kind, self.reason = "skip", m.group(1)
            return
        for word in rest.split():
            m = re.fullmatch(r"([A-Za-z_]\w*)=([A-Za-z_]\w*)", word)
            if not m:
                raise Failure(f"{self.where()}: unknown doc-block marker word '{word}' (allowed: "
                              f'no-compile "REGEX", skip (REASON), NAME=VALUE)')
            self.bind[m.group(1)] = m.group(2)


MARKER = re.compile(r"^\s*<!--\s*doc-block:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)(.*)$")


def looks_like_cpp(code):
    """An untagged block that looks like C++: includes, or statements ending in ';'."""
    text = "\n".join(code)
    if re.search(r"^\s*#\s*include\s*[<\"]", text, re.M):
        return True
    statements = [l for l in code if re.search(r"[;{}]\s*(//.*)?$", l.rstrip())]
    return len(statements) >= 2 and re.search(r"\w+::\w+|\w+\(.*\)", text) is not None


def read_page(root, page):
    path = os.path.join(root, page)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if MARKER.match(lines[i]):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                fm = FENCE.match(nxt)
                if not fm or fm.group(3).lower() not in CPP_TAGS:
                    raise Failure(f"{page}:{i + 1}: a doc-block marker must be the line just "
                                  f"before a ```cpp fence")
            i += 1
            continue
        indent, fence, tag = m.group(1), m.group(2), m.group(3).lower()
        end = i + 1
        close = re.compile(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        if end == len(lines):
            raise Failure(f"{page}:{i + 1}: the fenced block is never closed")
        code = []
        for l in lines[i + 1:end]:
            strip = min(len(indent), len(l) - len(l.lstrip(" ")))
            code.append(l[strip:])
        if tag in CPP_TAGS:
            prev = MARKER.match(lines[i - 1]) if i > 0 else None
            blocks.append(Block(page, i + 1, code, prev.group(1) if prev else None))
        elif tag == "" and looks_like_cpp(code):
            raise Failure(f"{page}:{i + 1}: this block looks like C++ but has no language: tag "
                          f"it ```cpp (it is then compiled), or give it another language")
        i = end + 1
    return blocks


# ---- the harness --------------------------------------------------------------------------------

class Harness:
    """The names tests/docs/harness.hpp offers: namespace loom_doc::values and ::types."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.values = {}  # name -> list of libraries it needs
        self.types = set()
        for section, target in (("values", self.values), ("types", self.types)):
            m = re.search(r"namespace loom_doc::" + section + r" \{(.*?)\}  // namespace loom_doc::"
                          + section, text, re.S)
            if not m:
                raise Failure(f"{path}: no namespace loom_doc::{section}")
            for name, needs in re.findall(r"^using (\w+) =[^;]*;[ \t]*(?://\s*needs:\s*(\w+))?",
                                          m.group(1), re.M):
                if section == "values":
                    target[name] = [needs] if needs else []
                else:
                    target.add(name)


# ---- cutting a block into items -----------------------------------------------------------------

def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines
    kept), so that positions and line numbers stay the same."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                                     or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                j = text.find(")" + m.group(1) + '"', i)
                j = n if j < 0 else j + len(m.group(1)) + 2
                blank(i + 1, j - 1)
                i = j
            else:
                i += 1
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def next_significant(clean, i):
    n = len(clean)
    while i < n and clean[i].isspace():
        i += 1
    return i


def word_at(clean, i):
    m = re.match(r"[A-Za-z_]\w*", clean[i:])
    return m.group(0) if m else ""


def cut_items(text):
    """(start, end) of each top-level item of the code: a preprocessor line, a statement or
    declaration ending in ';', or a braced one (a function, a namespace, a for loop...)."""
    clean = blank_comments_and_literals(text)
    items = []
    n = len(clean)
    i = next_significant(clean, 0)
    while i < n:
        start = i
        if clean[i] == "#":
            j = i
            while True:
                e = clean.find("\n", j)
                if e < 0:
                    e = n
                    break
                if clean[e - 1] == "\\":
                    j = e + 1
                    continue
                break
            items.append((start, e))
            i = next_significant(clean, e)
            continue
        first = word_at(clean, i)
        head_word = first
        depth = 0
        j = i
        end = None
        while j < n:
            c = clean[j]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0 and c == "}":
                    k = next_significant(clean, j + 1)
                    nxt = clean[k] if k < n else ""
                    w = word_at(clean, k)
                    if nxt == ";":
                        end = k + 1
                        break
                    if head_word in ("struct", "class", "union", "enum", "template"):
                        pass  # ends with its ';'
                    elif w in ("else", "catch") or (w == "while" and first == "do"):
                        pass
                    elif nxt and (nxt in ",.)]?:=(" or clean.startswith("->", k)):
                        pass
                    else:
                        end = j + 1
                        break
            elif c == ";" and depth == 0:
                end = j + 1
                break
            j += 1
        if end is None:
            end = n
        items.append((start, end))
        i = next_significant(clean, end)
    return clean, items


FUNCTION_HEAD = re.compile(
    r"\)\s*(?:const\b|noexcept\b|override\b|final\b|&&?|->\s*[^{;]+|\s)*$")


def classify(clean_item):
    """'include', 'global', 'declaration' or 'statement'."""
    s = clean_item.strip()
    if s.startswith("#"):
        return "include" if re.match(r"#\s*include\b", s) else "declaration"
    if re.match(r"namespace\s+[\w:]+\s*\{", s):
        return "global"
    if re.match(r"template\s*<\s*>", s) or re.match(r"BOOST_HANA_ADAPT_\w+\s*\(", s):
        return "global"
    first = word_at(s, 0)
    if first in ("template", "struct", "class", "union", "enum", "typedef", "using",
                 "static_assert", "namespace", "extern", "TORCH_MODULE"):
        return "declaration"
    if s.endswith("}") and first not in CONTROL and s[:1] not in "{[":
        head = s[:s.find("{")] if "{" in s else s
        if "(" in head and FUNCTION_HEAD.search(head) and not re.search(r"=\s*[^=]*$", head):
            return "declaration"  # a function definition
    return "statement"


# ---- which names a block declares and uses --------------------------------------------------------

IDENT = re.compile(r"[A-Za-z_]\w*")


def declared_names(clean):
    names = set()
    for m in re.finditer(r"\[\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*\]\s*[=:]", clean):
        before = clean[:m.start()].rstrip()
        if re.search(r"\bauto\s*[&*]*$", before):  # a structured binding
            names.update(x.strip() for x in m.group(1).split(","))
    for m in re.finditer(r",\s*([A-Za-z_]\w*)\s*=(?!=)", clean):  # a, b = ... and [n = 1]
        names.add(m.group(1))
    for m in re.finditer(r"\b(?:struct|class|union|enum(?:\s+class)?|namespace|using|typename)"
                         r"\s+([A-Za-z_]\w*)", clean):
        names.add(m.group(1))
    for m in IDENT.finditer(clean):
        name = m.group(0)
        k = next_significant(clean, m.end())
        if k >= len(clean) or clean[k] not in ";,=({[):" or clean.startswith("::", k):
            continue
        before = clean[:m.start()]
        stripped = before.rstrip()
        if not stripped:
            continue
        spaced = len(stripped) < len(before)
        tail = stripped
        if tail.endswith(("&", "*")):
            tail = tail.rstrip("&*")
            if tail[-1:].isspace() or not tail:  # `a * b`, `a & b`: an expression
                continue
        elif not spaced:
            continue
        last = tail[-1:]
        if last == ">":
            if tail[-2:-1].isspace() or tail.endswith("->"):
                continue
        elif last.isalnum() or last == "_":
            word = re.search(r"[A-Za-z_]\w*$", tail)
            if not word or word.group(0) in KEYWORDS_BEFORE_USE:
                continue
        else:
            continue
        names.add(name)
    return names


def used_names(clean):
    used = set()
    for m in IDENT.finditer(clean):
        before = clean[:m.start()].rstrip()
        if before.endswith((".", "->", "::")):
            continue
        used.add((m.group(0), clean.startswith("::", next_significant(clean, m.end()))))
    return used


# ---- the generated code -------------------------------------------------------------------------

def is_quote(block):
    """A block whose first line names the file it quotes (docs.quotes checks its lines)."""
    return bool(block.code) and re.match(r"//\s*(examples|tests|include|benchmarks)/\S+",
                                         block.code[0].strip()) is not None


def page_id(page):
    return re.sub(r"\W", "_", page)


def analyse(block, harness):
    text = "\n".join(block.code)
    clean, spans = cut_items(text)
    items = []
    for a, b in spans:
        kind = classify(clean[a:b])
        line = block.first_line + text.count("\n", 0, a)
        items.append((kind, line, text[a:b], clean[a:b]))
    statements = "\n".join(c for k, _, _, c in items if k == "statement")
    everything = "\n".join(c for _, _, _, c in items)
    declared = declared_names(everything)
    values, types = [], []
    for name in sorted({name for name, qualified in used_names(statements) if not qualified}):
        if name in declared:
            continue
        if name in block.bind:
            values.append((name, block.bind[name]))
        elif name in harness.values:
            values.append((name, name))
    if is_quote(block):
        for name in sorted({name for name, _ in used_names(everything)}):
            if name in harness.types and name not in declared:
                types.append(name)
    for name in block.bind:
        if block.bind[name] not in harness.values:
            raise Failure(f"{block.where()}: {name}={block.bind[name]}: the harness has no value "
                          f"'{block.bind[name]}' (namespace loom_doc::values)")
        if name not in (v for v, _ in values):
            raise Failure(f"{block.where()}: {name}={block.bind[name]}, but the block does not use "
                          f"{name} (or declares it)")
    needs = set()
    for lib, pattern in NEEDS.items():
        if pattern.search(blank_comments_and_literals(text)):
            needs.add(lib)
    for _, value in values:
        needs.update(harness.values[value])
    block.needs = sorted(needs)
    return items, values, types


def quote_path(path):
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def wrap_block(block, harness, root, register):
    """(includes, code) for one block."""
    items, values, types = analyse(block, harness)
    source = quote_path(os.path.join(root, block.page))
    pid = page_id(block.page)
    includes, globals_, decls, statements = [], [], [], []
    for kind, line, code, _ in items:
        piece = f"#line {line} {source}\n{code}\n"
        {"include": includes, "global": globals_, "declaration": decls,
         "statement": statements}[kind].append(piece if kind != "include" else code.strip())
    ns = f"loom_doc_pages::{pid}::line_{block.line}"
    out = [f"// ---- {block.where()} " + "-" * max(4, 80 - len(block.where()))]
    out += globals_
    out.append(f"{RESTORE}\nnamespace {ns} {{")
    out.append("using namespace loom_doc::functions;")
    out += [f"using {t} = loom_doc::types::{t};" for t in types]
    out += decls
    if statements or values:
        out.append("[[maybe_unused]] auto compiled_block() {")
        for name, value in values:
            out.append(f"  [[maybe_unused]] auto& {name} = "
                       f"loom_doc::value<loom_doc::values::{value}>();")
        out += statements
        if re.search(r"\breturn\b", "\n".join(c for k, _, _, c in items if k == "statement")):
            out.append(f"{RESTORE}\n  loom_doc::unreachable();")  # no path falls off the end
        out.append("}")
    out.append(RESTORE)
    if register:
        out.append(f'[[maybe_unused]] const bool registered = loom_doc::register_block('
                   f'{quote_path(block.page)}, {block.line}, "{block.digest}");')
    out.append(f"}}  // namespace {ns}")
    return includes, "\n".join(out) + "\n"


def page_source(page, blocks, harness, root, without):
    includes, parts = [], []
    for block in blocks:
        if block.kind != "compile":
            analyse(block, harness)
            continue
        inc, code = wrap_block(block, harness, root, register=True)
        if set(block.needs) & set(without):
            parts.append(f"// {block.where()}: left out, it needs loom::{' and loom::'.join(block.needs)}\n")
            continue
        includes += [i for i in inc if i not in includes]
        parts.append(code)
    head = [f"// Generated by tests/docs/extract_blocks.py from {page}: its compiled C++ blocks.",
            "// Edit the page, not this file."]
    head += includes
    head.append('#include "harness.hpp"')
    head += UNUSED
    return "\n".join(head) + "\n\n" + "\n".join(parts)


RESTORE = "#line RESTORE"
# A block's variables are for the code the page leaves out: unused ones are no mistake here.
UNUSED = ['#pragma GCC diagnostic ignored "-Wunused-variable"',
          '#pragma GCC diagnostic ignored "-Wunused-but-set-variable"']


def finalize(text, path):
    """Replaces each RESTORE line by a #line naming the generated file's own next line."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line == RESTORE:
            lines[i] = f"#line {i + 2} {quote_path(path)}"
    return "\n".join(lines)


def write_if_changed(path, text):
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ---- the commands ---------------------------------------------------------------------------------

def load(args):
    harness = Harness(args.harness)
    pages = []
    for page in args.pages:
        rel = os.path.relpath(os.path.abspath(page), args.root)
        pages.append((rel, read_page(args.root, rel)))
    return harness, pages


def cmd_generate(args):
    harness, pages = load(args)
    for page, blocks in pages:
        path = os.path.join(os.path.abspath(args.out_dir), page_id(page) + ".cpp")
        write_if_changed(path, finalize(page_source(page, blocks, harness, args.root,
                                                    args.without), path))
    return 0


def cmd_list(args):
    harness, pages = load(args)
    for page, blocks in pages:
        for block in blocks:
            items, values, types = analyse(block, harness)
            print(f"{block.where()}: {block.kind}{' ' + block.reason if block.reason else ''}; "
                  f"needs {block.needs or 'loom::loom only'}")
            print(f"  values {values}  types {types}")
            for kind, line, code, _ in items:
                first = code.strip().split("\n")[0]
                print(f"  {line:4} {kind:11} {first[:70]}")
    return 0


def compile_no_compile(block, harness, args):
    """Compiles one no-compile block through the probe target; returns (error or None, the
    line of the compiler's output that matched)."""
    includes, code = wrap_block(block, harness, args.root, register=False)
    text = "\n".join(includes + ['#include "harness.hpp"'] + UNUSED + ["", code])
    text = finalize(text, os.path.abspath(args.probe_file))
    with open(args.probe_file, "w", encoding="utf-8") as f:
        f.write(text)
    run = subprocess.run([args.cmake, "--build", args.build_dir, "--target", args.probe_target],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = run.stdout
    if run.returncode == 0:
        return "it compiled", ""
    # The first error must be the one marked: later ones may be a cascade of anything.
    errors = [l.strip() for l in output.splitlines() if re.search(r"\berror:", l)]
    if errors and re.search(block.expect, errors[0]):
        return None, errors[0]
    tail = "\n".join(output.splitlines()[-25:])
    return f"its first error is not \"{block.expect}\":\n{tail}", ""


def cmd_check(args):
    harness, pages = load(args)
    if not os.path.exists(args.program):
        raise Failure(f"{args.program} does not exist: build it first")
    run = subprocess.run([args.program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    if run.returncode != 0:
        raise Failure(f"{args.program} exited with {run.returncode}:\n{run.stdout}")
    built = {}
    for line in run.stdout.splitlines():
        m = re.fullmatch(r"block (\S+):(\d+) (\w+)", line.strip())
        if m:
            built[(m.group(1), int(m.group(2)))] = m.group(3)
    problems = []
    totals = {"compiled": 0, "no-compile": 0, "skip": 0, "left out": 0}
    print(f"{'page':24} {'compiled':>8} {'no-compile':>10} {'skip':>5} {'left out':>8}")
    for page, blocks in pages:
        counts = dict.fromkeys(totals, 0)
        for block in blocks:
            key = (block.page, block.line)
            analyse(block, harness)
            if block.kind == "skip":
                counts["skip"] += 1
                print(f"  {block.where()}: skipped: {block.reason}")
            elif block.kind == "no-compile":
                error, matched = compile_no_compile(block, harness, args) if args.probe_file \
                    else ("no probe target to compile it with", "")
                if error:
                    problems.append(f"{block.where()}: a no-compile block: {error}")
                else:
                    counts["no-compile"] += 1
                    print(f"  {block.where()}: fails to compile, as marked: {matched[:160]}")
            elif set(block.needs) & set(args.without):
                counts["left out"] += 1
                print(f"  {block.where()}: left out: needs loom::"
                      f"{' and loom::'.join(block.needs)}, which this build lacks")
            elif built.pop(key, None) != block.digest:
                problems.append(f"{block.where()}: not in {os.path.basename(args.program)} as it "
                                f"is now (build it again: the page changed since)")
            else:
                counts["compiled"] += 1
        if blocks:
            print(f"{page:24} {counts['compiled']:8} {counts['no-compile']:10} {counts['skip']:5} "
                  f"{counts['left out']:8}")
        for k in totals:
            totals[k] += counts[k]
    for (page, line), _ in sorted(built.items()):
        problems.append(f"{page}:{line}: compiled, but no such block on the page now (build again)")
    print(f"{'total':24} {totals['compiled']:8} {totals['no-compile']:10} {totals['skip']:5} "
          f"{totals['left out']:8}")
    if totals["compiled"] == 0:
        problems.append("no block was compiled")
    if problems:
        for p in problems:
            print(f"doc blocks: FAILED: {p}")
        return 1
    print(f"doc blocks: ok: {totals['compiled']} compiled, {totals['no-compile']} fail to compile "
          f"as marked, {totals['skip']} skipped, {totals['left out']} left out")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["generate", "check", "list"])
    parser.add_argument("pages", nargs="+")
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(here)))
    parser.add_argument("--harness", default=os.path.join(here, "harness.hpp"))
    parser.add_argument("--out-dir")
    parser.add_argument("--without", action="append", default=[], choices=sorted(NEEDS))
    parser.add_argument("--program")
    parser.add_argument("--probe-file")
    parser.add_argument("--probe-target")
    parser.add_argument("--build-dir")
    parser.add_argument("--cmake", default="cmake")
    args = parser.parse_args()
    args.root = os.path.abspath(args.root)
    try:
        if args.command == "generate":
            if not args.out_dir:
                raise Failure("generate needs --out-dir")
            return cmd_generate(args)
        if args.command == "check":
            if not args.program:
                raise Failure("check needs --program")
            return cmd_check(args)
        return cmd_list(args)
    except Failure as e:
        print(f"doc blocks: FAILED: {e}", file=sys.stderr if args.command == "generate" else
              sys.stdout)
        return 1


if __name__ == "__main__":
    sys.exit(main())
