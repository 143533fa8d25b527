#!/usr/bin/env python3
"""The documents' code and links, checked (README.md, python/README.md, docs/*.md).

Every fenced code block marked `c` is one of:
  - an excerpt: its first line is `/* from examples/FILE.c */` (or another
    .c file of the tree); its other lines, split at lines holding only
    `...` or `/* ... */`, must each run as consecutive lines of that file,
    in order, so the text cannot drift from what the tests build and run;
  - declarations from a header: first line `/* from include/FILE.h ... */`
    (or another .h file of the tree, such as ggml/include/ggml-clattn.h);
    every name in it that holds `clattn` (any case) must be declared by
    that header, and every function declaration in it must run in the
    header token for token (comments and spacing aside; the header's may
    have more in front, such as an export macro); a block with neither
    checks nothing and fails;
  - a translation unit: compiled with -std=c11 -Wall -Wextra -Werror against
    include/, and linked against the built library when it has a main().
A `c` block whose first line says `/* from` something other than a .c or
.h file fails. Every block marked `python` is byte-compiled, and run (each
in a fresh interpreter, the package from python/ over the built library)
where the given interpreter has numpy and a clattn context can be created,
else compiled only, saying why. A fenced block marked otherwise, or not at
all, matches no rule and fails (text that is not checked goes in an
indented block). Every relative link must name a file or folder of the
tree, and every #anchor a heading (GitHub's rule) of its file.

  doc_check.py --root SRC [--lib LIBCLATTN] [--python PY] -- CC [CC ARGS...]
  doc_check.py --self-test -- CC [CC ARGS...]

Exit status: 0 when everything holds, 1 otherwise (each failure named with
its file and line).
"""
import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
SOURCE_REF = re.compile(r"^/\*\s*from\s+([\w./-]+\.[ch])\b")
FROM_ANY = re.compile(r"^/\*\s*from\s+(\S+?)[\s:,*]")
ELISION = re.compile(r"^\s*(\.\.\.|/\*\s*\.\.\.\s*\*/)\s*$")
PUBLIC_NAME = re.compile(r"\b\w*clattn\w*", re.I)  # clattn_*, CLATTN_*, ggml_backend_clattn_*, ...
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
TOKEN = re.compile(r"\w+|[^\s\w]")
CHECKED_LANGUAGES = ("c", "python", "py")
IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.M)


def documents(root):
    names = ["README.md", os.path.join("python", "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        names += sorted(os.path.join("docs", n) for n in os.listdir(docs) if n.endswith(".md"))
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def parse(text):
    """(blocks, prose): blocks as (info, first line number, lines); prose as
    (line number, line) outside code blocks."""
    blocks, prose, lines = [], [], text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).lower(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            body.append(lines[i][len(m.group(1)):] if lines[i].startswith(m.group(1)) else lines[i])
            i += 1
        i += 1
        blocks.append((info, start, body))
    return blocks, prose


def slug(heading):
    """GitHub's anchor for a heading: the rendered text lowercased, every
    character but letters, digits, '_', '-' and spaces dropped, spaces '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]", "", text).lower()
    return "".join(c for c in text if c.isalnum() or c in "_- ").replace(" ", "-")


def anchors(text):
    found, seen = set(), {}
    blocks, prose = parse(text)
    for _, line in prose:
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else "%s-%d" % (s, n))
        found.update(HTML_ANCHOR.findall(line))
    return found


class Checker:
    def __init__(self, root, cc, lib=None, python=None, quiet=False):
        self.root, self.cc, self.lib, self.python, self.quiet = root, cc, lib, python, quiet
        self.failures, self.counts, self._anchors = [], {}, {}
        self.tmp = tempfile.mkdtemp(prefix="clattn-doc-check-")
        atexit.register(shutil.rmtree, self.tmp, True)
        self.runner, self.runner_note = self._probe_python()

    def fail(self, where, what):
        self.failures.append("%s: %s" % (where, what))

    def note(self, what):
        if not self.quiet:
            print(what)

    def count(self, kind):
        self.counts[kind] = self.counts.get(kind, 0) + 1

    # ---- links --------------------------------------------------------------

    def anchors_of(self, path):
        if path not in self._anchors:
            with open(path, encoding="utf-8") as f:
                self._anchors[path] = anchors(f.read())
        return self._anchors[path]

    def check_links(self, name, prose):
        here = os.path.dirname(os.path.join(self.root, name))
        for number, line in prose:
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                    continue  # a URL: not checked here
                self.count("relative links")
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(self.root, name)
                where = "%s:%d" % (name, number)
                if not os.path.exists(full):
                    self.fail(where, "link to %s: no such file" % target)
                elif anchor and not full.endswith(".md"):
                    self.fail(where, "link to %s: an anchor into a file that is not Markdown" % target)
                elif anchor and anchor not in self.anchors_of(full):
                    self.fail(where, "link to %s: no heading with that anchor in %s"
                              % (target, os.path.relpath(full, self.root)))

    # ---- C ------------------------------------------------------------------

    @staticmethod
    def tokens(code):
        """The code's tokens, comments, preprocessor lines and elisions left
        out, joined by single spaces."""
        code = COMMENT.sub(" ", code)
        code = "\n".join(l for l in code.split("\n") if not l.lstrip().startswith("#") and not ELISION.match(l))
        return " ".join(TOKEN.findall(code))

    @classmethod
    def function_declarations(cls, code):
        """Each function declaration of the block's code (a statement at the
        top level, or after a closing brace, that ends in a parameter list),
        as tokens."""
        found = []
        for statement in cls.tokens(code).split(";"):
            tail = re.split(r"[{}]", statement)[-1].strip()
            if tail.endswith(")") and "(" in tail and not tail.startswith("typedef "):
                found.append(tail + " ;")
        return found

    def check_declarations(self, where, header, source, rest):
        code = "\n".join(rest)
        declared = set(PUBLIC_NAME.findall(source))
        names = set(PUBLIC_NAME.findall(code))
        functions = self.function_declarations(code)
        if not names and not functions:
            return self.fail(where, "checks nothing: no name holding 'clattn' and no function declaration to find "
                             "in %s" % header)
        self.count("C declarations checked against a header")
        for name in sorted(names - declared):
            self.fail(where, "%s is not declared in %s" % (name, header))
        header_tokens = " %s " % self.tokens(source)
        # an inline function's definition declares it too (clattn_params_default)
        header_tokens += " ".join(m.group(1) + " ; " for m in re.finditer(r"static inline ([^;{}]*?\)) \{", header_tokens))
        for f in functions:
            if " %s " % f not in header_tokens:
                self.fail(where, "this declaration is not %s's:\n  %s" % (header, f))

    def check_c(self, where, body):
        first = next((l for l in body if l.strip()), "")
        ref = SOURCE_REF.match(first.strip())
        other = FROM_ANY.match(first.strip() + " ")
        if other and not ref:
            return self.fail(where, "says it is from %s: the check knows excerpts of .c files and declarations of "
                             ".h files" % other.group(1))
        if ref:
            path = os.path.join(self.root, ref.group(1))
            if not os.path.isfile(path):
                return self.fail(where, "names %s, which does not exist" % ref.group(1))
            with open(path, encoding="utf-8") as f:
                source = f.read()
            rest = body[body.index(first) + 1:]
            if path.endswith(".h"):
                return self.check_declarations(where, ref.group(1), source, rest)
            self.count("C excerpts of compiled files")
            return self.check_excerpt(where, ref.group(1), source.split("\n"), rest)
        self.count("C blocks compiled")
        src = os.path.join(self.tmp, "block%d.c" % sum(self.counts.values()))
        with open(src, "w", encoding="utf-8") as f:
            f.write("\n".join(body) + "\n")
        has_main = re.search(r"\bint\s+main\s*\(", "\n".join(body)) is not None
        cmd = self.cc + ["-std=c11", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(self.root, "include"), src]
        if has_main and self.lib:
            cmd += [self.lib, "-lOpenCL", "-lm", "-o", src[:-2]]
        else:
            cmd += ["-c", "-o", src[:-2] + ".o"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        if r.returncode != 0:
            self.fail(where, "does not compile:\n" + r.stdout.replace(src, "block"))

    def check_excerpt(self, where, name, source, rest):
        chunks, chunk = [], []
        for line in rest:
            if ELISION.match(line):
                chunks.append(chunk)
                chunk = []
            else:
                chunk.append(line.rstrip())
        chunks.append(chunk)
        lines = [l.rstrip() for l in source]
        at = 0
        for chunk in chunks:
            while chunk and not chunk[-1]:
                chunk.pop()
            if not chunk:
                continue
            found = next((i for i in range(at, len(lines) - len(chunk) + 1) if lines[i:i + len(chunk)] == chunk), None)
            if found is None:
                return self.fail(where, "no longer an excerpt of %s: these lines are not in it, in this order:\n  %s"
                                 % (name, "\n  ".join(chunk)))
            at = found + len(chunk)

    # ---- Python -------------------------------------------------------------

    def python_env(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(self.root, "python") + os.pathsep + env.get("PYTHONPATH", "")
        if self.lib:
            env["CLATTN_LIBRARY"] = self.lib
        return env

    def _probe_python(self):
        if not self.python or not os.path.exists(self.python):
            return None, "no interpreter with numpy given (tools/scripts/python.sh makes one)"
        if not self.lib:
            return None, "no built library given"
        r = subprocess.run([self.python, "-c", "import numpy, clattn; print(clattn.Context().device_name)"],
                           env=self.python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, timeout=600)
        if r.returncode != 0:
            tail = r.stdout.strip().split("\n")[-1]
            return None, "%s cannot create a clattn context (%s)" % (self.python, tail)
        return self.python, "run with %s on %s" % (self.python, r.stdout.strip())

    def importable(self, modules):
        code = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
        r = subprocess.run([self.runner, "-c", code] + sorted(modules), env=self.python_env(),
                           stdout=subprocess.PIPE, universal_newlines=True)
        return r.stdout.split()

    def check_python(self, where, body):
        text = "\n".join(body) + "\n"
        try:
            compile(text, where, "exec")
        except SyntaxError as e:
            return self.fail(where, "does not compile: %s (line %s of the block)" % (e.msg, e.lineno))
        if not self.runner:
            return self.count("Python blocks compiled only")
        missing = self.importable(set(IMPORT.findall(text)))
        if missing:
            self.note("%s: compiled only: %s not importable" % (where, ", ".join(missing)))
            return self.count("Python blocks compiled only")
        self.count("Python blocks run")
        r = subprocess.run([self.runner, "-c", text], env=self.python_env(), cwd=self.tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
        if r.returncode != 0:
            self.fail(where, "fails when run:\n" + r.stdout)

    # ---- all ----------------------------------------------------------------

    def run(self, names):
        for name in names:
            with open(os.path.join(self.root, name), encoding="utf-8") as f:
                blocks, prose = parse(f.read())
            self.check_links(name, prose)
            for info, line, body in blocks:
                where = "%s:%d" % (name, line)
                if info == "c":
                    self.check_c(where, body)
                elif info in ("python", "py"):
                    self.check_python(where, body)
                else:
                    self.fail(where, "a block marked %s: the check reads blocks marked %s; put text that is not "
                              "checked in an indented block" % ("'%s'" % info if info else "as nothing",
                                                               ", ".join(CHECKED_LANGUAGES)))
        self.note("Python blocks: " + (self.runner_note if self.runner else "compiled only: " + self.runner_note))
        for kind in sorted(self.counts):
            self.note("%s: %d" % (kind, self.counts[kind]))
        for f in self.failures:
            self.note("FAILED " + f)
        return not self.failures


def self_test(cc):
    """The checker against a small tree with one of each failure: each must be
    found, and the same tree mended must pass."""
    root = tempfile.mkdtemp(prefix="clattn-doc-selftest-")
    atexit.register(shutil.rmtree, root, True)
    for d in ("docs", "examples", "include"):
        os.mkdir(os.path.join(root, d))
    files = {
        "include/clattn.h": "int clattn_answer(void);\n",
        "include/plugin.h": "/* a plug-in's: names with clattn after a prefix */\nint plugin_clattn_reg(void);\n",
        "examples/ex.c": "#include <clattn.h>\nint main(void) {\n  int x = 1;\n  return x - 1;\n}\n",
        "docs/page.md": "# Page\n\n## A section\n\nBack to [the README](../README.md#top).\n",
        "README.md": "\n".join([
            "# Top", "", "[ok](docs/page.md#a-section) [gone](docs/none.md) [bad anchor](docs/page.md#nowhere)",
            "", "```c", "/* from examples/ex.c */", "int main(void) {", "...", "  return x - 1;", "```",
            "", "```c", "/* from examples/ex.c */", "  return x + 1;", "```",
            "", "```c", "/* from include/clattn.h */", "int clattn_answer(void);", "int clattn_question(void);",
            "```", "", "```c", "#include <clattn.h>", "int f(void) { return clattn_answer() }", "```",
            "", "```python", "print('ok'", "```",
            # a plug-in's declaration (ggml-style name), a signature not the header's, a block that checks nothing,
            # a source the check does not know, a block of a language it does not read
            "", "```c", "/* from include/plugin.h */", "int plugin_clattn_register(void);", "```",
            "", "```c", "/* from include/clattn.h */", "int clattn_answer(int question);", "```",
            "", "```c", "/* from include/clattn.h */", "typedef int answer;", "```",
            "", "```c", "/* from examples/ex.cpp */", "int main(void) { return 0; }", "```",
            "", "```sh", "echo unchecked", "```", ""]),
    }
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    c = Checker(root, cc, quiet=True)
    c.run(documents(root))
    expected = ["docs/none.md: no such file", "#nowhere: no heading", "no longer an excerpt of examples/ex.c",
                "clattn_question is not declared", "README.md:23: does not compile", "README.md:28: does not compile",
                "README.md:17: this declaration is not include/clattn.h's",
                "README.md:32: plugin_clattn_register is not declared in include/plugin.h",
                "README.md:32: this declaration is not include/plugin.h's",
                "README.md:37: this declaration is not include/clattn.h's", "README.md:42: checks nothing",
                "README.md:47: says it is from examples/ex.cpp", "README.md:52: a block marked 'sh'"]
    ok = len(c.failures) == len(expected)
    for e in expected:
        if not any(e in f for f in c.failures):
            print("self-test: the failure '%s' was not found" % e)
            ok = False
    if not ok:
        print("self-test: failures found:\n  " + "\n  ".join(c.failures))
    # mended: every failure fixed, nothing reported
    mended = files["README.md"].replace(" [gone](docs/none.md) [bad anchor](docs/page.md#nowhere)", "")
    mended = mended.replace("x + 1", "x - 1").replace("int clattn_question(void);\n", "")
    mended = mended.replace("clattn_answer() }", "clattn_answer(); }").replace("print('ok'", "print('ok')")
    mended = mended.replace("plugin_clattn_register", "plugin_clattn_reg").replace("(int question)", "(void)")
    mended = mended.replace("typedef int answer;", "int clattn_answer(void);")
    mended = mended.replace("/* from examples/ex.cpp */", "/* compiled as it stands */")
    mended = mended.replace("```sh\necho unchecked\n```", "    echo unchecked")
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write(mended)
    c = Checker(root, cc, quiet=True)
    if not c.run(documents(root)):
        print("self-test: the mended tree should pass:\n  " + "\n  ".join(c.failures))
        ok = False
    print("self-test: %s" % ("passed" if ok else "FAILED"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root")
    ap.add_argument("--lib")
    ap.add_argument("--python")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("cc", nargs="+")
    a = ap.parse_args()
    if a.self_test:
        return 0 if self_test(a.cc) else 1
    absolute = lambda path: os.path.abspath(path) if path else None
    c = Checker(os.path.abspath(a.root), a.cc, absolute(a.lib), absolute(a.python))
    return 0 if c.run(documents(c.root)) else 1


if __name__ == "__main__":
    sys.exit(main())
