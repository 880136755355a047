#!/usr/bin/env python3
"""tools/check_comment_refs.py: the repository paths that comments and docs name still exist.

A comment that says where something lives ("the rows live in tests/parity/parity_layers.cpp", "see
docs/cuda.md") goes stale silently when the file moves. This check reads every comment of the
tracked sources and every line of the tracked Markdown, finds the references to files of this
repository, and reports each one that no longer resolves:

    engine/NAME.h:12: 'layers/OLD_NAME.h' does not exist
    docs/NAME.md:40: 'gemm.cu' has no 'OLD_KERNEL_NAME'

What is scanned: the files `git ls-files` lists (every file under the root when it is not a git
work tree) named *.h *.hpp *.cpp *.cu *.cuh (their // and /* */ comments; string and character
literals skipped), *.py (# comments and docstrings), *.sh, *.cmake, *.cmake.in, CMakeLists.txt
(# comments, and CMake's #[[ ]] comments; strings and shell here-documents skipped) and *.md (every
line). No file is left out: Kiln has no third-party or generated sources in git.

What is a reference, and when it resolves:
  * A path from the root: it starts with one of the top-level folders (engine/ layers/ comm/
    data/ models/ apps/ tests/ datasets/ docs/ tools/ examples/ .ci/ cmake/, optionally after
    ./), or is README.md or CMakeLists.txt alone. It must name a tracked file or a folder that
    holds one, or, without an extension, a program the build writes there (apps/mnist_train,
    tests/fuzz/image_decode): its name must then occur, outside comments, in that folder's
    CMakeLists.txt or *.cmake. A pattern must match at least one: * and ? as in the shell (a *
    may cross a /), and {a,b} alternatives, each of which must resolve (engine/impl.{h,cpp}).
  * A file name with a colon and what follows it, FILE.EXT:NAME or FILE.EXT:LINE, with or
    without folders before it (sim/kernel.h:launch): the file must exist (any tracked file whose
    path ends with the name given counts when several do); NAME, an identifier (a::b allowed),
    must occur in one of those files as a word; LINE must not be past its end. A line number is
    also reported as a warning, since it moves whenever the lines above it change: name the
    function instead. Warnings do not fail the check.
  * A name next to a path from the root: NAME in PATH, NAME of PATH, NAME from PATH, NAME (PATH
    ...), where NAME is in backticks or is an identifier with a _ or a :: in it (dropout_keep in
    layers/dropout_kernels.h, `Loader` (data/loader.h)): NAME must occur in that file as a word.
  * In Markdown, links too: [text](target), [text]: target and src="target", relative to the
    .md file's folder (a target starting with / from the root); web addresses and #anchors are
    not checked, and the #anchor part of a target is dropped.
  A component in capitals stands for any name (tests/fuzz/corpus/TARGET/, docs/NAME.md): a path
  that does not resolve as written is checked up to the folder before it. FILE.EXT is one of the
  extensions of REF_EXTENSIONS below; a path ends at the first character that cannot be part of
  one, and a trailing '.' or ',' (a sentence's) is dropped.

What is not checked, on purpose:
  * What Kiln writes at run time and never tracks: build trees (build*/, which are not top-level
    folders of the list above, so no path there is a reference) and under datasets/ everything
    but its tracked files (datasets/mnist/, datasets/mnist_png/, the downloaded archives): the
    RUNTIME_PATTERNS below.
  * The MNIST files (train-images-idx3-ubyte, ...), wherever a command's --data puts them.
  * A path that follows another path character (build/tests/x, $root/tools/x, ../engine/x
    outside a Markdown link): it is not a path from the root.
  * Bare file names without a colon (see gemm.cu): too common in prose to resolve reliably.

Usage:
  tools/check_comment_refs.py [--root DIR] [--quiet]
    --root   the tree to check (default: the repository this script is in)
    --quiet  no warnings, only broken references and the summary
Exit codes: 0 every reference resolves; 1 some do not (one line each); 2 bad usage.
"""
import fnmatch
import io
import os
import re
import subprocess
import sys
import tokenize

TOP_FOLDERS = ["engine", "layers", "comm", "data", "models", "apps", "tests", "datasets", "docs",
               "tools", "examples", ".ci", "cmake"]
TOP_FILES = ["README.md", "CMakeLists.txt"]
# Paths that exist only once something has run: downloaded or converted data. A reference to one
# of them is not checked (datasets/README.md and datasets/fetch_mnist.sh are tracked and are).
RUNTIME_PATTERNS = ["datasets/mnist*", "datasets/cifar*", "datasets/imagenet*", "datasets/*.tgz",
                    "datasets/*.gz", "*-idx[13]-ubyte*"]
# The extensions a FILE.EXT:NAME reference may have.
REF_EXTENSIONS = ["h", "hpp", "cpp", "cu", "cuh", "c", "cc", "py", "sh", "cmake", "md", "txt", "json"]

C_EXTENSIONS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
HASH_EXTENSIONS = (".sh", ".cmake", ".cmake.in")

_top = "|".join(re.escape(t) for t in TOP_FOLDERS)
_path_char = r"(?:[\w.*?+/-]|\{[\w.,*-]*\})"
# A path from the root, then perhaps :NAME or :LINE.
PATH_RE = re.compile(r"(?<![\w./$%%-])(?:\./)?((?:(?:%s)/%s*)|(?:%s)(?![\w.-]))"
                     r"(?::(\d+|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)(?![\w.-]))?"
                     % (_top, _path_char, "|".join(re.escape(f) for f in TOP_FILES)))
_ext = "|".join(REF_EXTENSIONS)
# FILE.EXT:NAME or FILE.EXT:LINE, perhaps after folders (not from the root: PATH_RE has those).
NAMED_RE = re.compile(r"(?<![\w./$%-])((?:[\w-]+/)*[\w-]+\.(?:" + _ext + r")):"
                      r"(\d+|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)(?![\w.-])")
# NAME in PATH, NAME of PATH, NAME from PATH, NAME (PATH: NAME in backticks (`Loader`,
# `sgemm_kernel()`), or bare with a _ or :: in it (dropout_keep, Tensor::item()).
NAME_NEAR_PATH_RE = re.compile(
    r"(?:`([A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*)(?:\(\))?`|(?<![\w.:/-])([A-Za-z_]\w*(?:_\w+|::~?[A-Za-z_]\w*)+)"
    r"(?:\(\))?)\s+(?:(?:in|of|from)\s+|\()`?(?:\./)?((?:%s)/%s*)" % (_top, _path_char))
# A component that stands for a name: TARGET, NAME, NAME.md.
PLACEHOLDER_RE = re.compile(r"^(?!README\.)[A-Z][A-Z0-9_]*(?:\.\w+)?$")
MD_LINK_RE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MD_DEF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
MD_SRC_RE = re.compile(r"\b(?:src|href)=\"([^\"]+)\"")


# ---- comments, per kind of file ----------------------------------------------------------------
# Each returns [(line number, text)], one entry per physical line of comment.

_PP_NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|[\w.'])*")  # 1'000, 1e-5f, 0x1p+3
_RAW_PREFIXES = ("R", "u8R", "uR", "UR", "LR")


def c_comments(text):
    """// and /* */ comments of C, C++ and CUDA; string, character and raw string literals and
    numbers with ' separators skipped."""
    out = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c.isalpha() or c == "_":
            m = re.compile(r"\w+").match(text, i)
            i = m.end()
            if m.group(0) in _RAW_PREFIXES and text.startswith('"', i):
                d = re.compile(r'"([^()\\\s]{0,16})\(').match(text, i)
                if d:
                    end = text.find(")" + d.group(1) + '"', d.end())
                    end = n if end < 0 else end + len(d.group(1)) + 2
                    line += text.count("\n", i, end)
                    i = end
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            i = _PP_NUMBER.match(text, i).end()
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def python_comments(text):
    """# comments and docstrings (a string that is a statement of its own) of Python."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # Not Python that tokenizes: every # to the end of its line, as for shell.
        return hash_comments(text, shell=True)
    skip = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    significant = [t for t in tokens if t.type not in skip]
    for t in tokens:
        if t.type == tokenize.COMMENT:
            out.append((t.start[0], t.string[1:]))
    for k, t in enumerate(significant):
        if t.type != tokenize.STRING:
            continue
        before = significant[k - 1].type if k else tokenize.NEWLINE
        after = significant[k + 1].type if k + 1 < len(significant) else tokenize.NEWLINE
        if before in (tokenize.NEWLINE, tokenize.ENCODING) and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
            for j, part in enumerate(t.string.split("\n")):
                out.append((t.start[0] + j, part))
    return sorted(out)


_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][\w-]*)\2")  # not $(( a << 15 ))
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


def hash_comments(text, shell):
    """# comments of shell (shell=True: '' and "" strings, backslashes and here-documents
    skipped; a # starts a comment only at the start of a word) or CMake ("" strings, [[ ]]
    arguments skipped; #[[ ]] comments read)."""
    out = []
    i, n, line = 0, len(text), 1
    heredocs = []  # (delimiter, tabs stripped) waiting for the end of the line
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            for delim, dash in heredocs:  # skip each body up to its delimiter line
                while i < n:
                    j = text.find("\n", i)
                    j = n if j < 0 else j
                    body_line = text[i:j]
                    i = j + 1 if j < n else n
                    line += 1
                    if (body_line.lstrip("\t") if dash else body_line) == delim:
                        break
            heredocs = []
        elif c == "\\":
            i += 2
        elif c == "#" and (not shell or i == 0 or text[i - 1] in " \t\n;|&()"):
            m = _BRACKET_OPEN.match(text, i + 1) if not shell else None
            if m:
                close = "]" + m.group(1) + "]"
                j = text.find(close, m.end())
                j = n if j < 0 else j
                for k, part in enumerate(text[m.end():j].split("\n")):
                    out.append((line + k, part))
                line += text.count("\n", i, j)
                i = j + len(close)
            else:
                j = text.find("\n", i)
                j = n if j < 0 else j
                out.append((line, text[i + 1:j]))
                i = j
        elif c == '"' or (c == "'" and shell):
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\" and c == '"':
                    j += 1
                j += 1
            line += text.count("\n", i, j)
            i = j + 1
        elif shell and text.startswith("<<", i) and not text.startswith("<<<", i):
            m = _HEREDOC.match(text, i)
            if m:
                heredocs.append((m.group(3), m.group(1) == "-"))
                i = m.end()
            else:
                i += 2
        elif not shell and c == "[" and _BRACKET_OPEN.match(text, i):
            m = _BRACKET_OPEN.match(text, i)
            close = "]" + m.group(1) + "]"
            j = text.find(close, m.end())
            j = n if j < 0 else j
            line += text.count("\n", i, j)
            i = j + len(close)
        else:
            i += 1
    return out


def markdown_lines(text):
    return [(k + 1, part) for k, part in enumerate(text.split("\n"))]


def comments_of(path, text):
    name = os.path.basename(path)
    if name.endswith(C_EXTENSIONS):
        return c_comments(text)
    if name.endswith(".py"):
        return python_comments(text)
    if name.endswith(".sh"):
        return hash_comments(text, shell=True)
    if name == "CMakeLists.txt" or name.endswith(HASH_EXTENSIONS):
        return hash_comments(text, shell=False)
    if name.endswith(".md"):
        return markdown_lines(text)
    return None


# ---- the tree ----------------------------------------------------------------------------------

class Tree:
    """The tracked files of the root (or every file, outside git), their folders, and their
    contents on demand."""

    def __init__(self, root):
        self.root = root
        files = None
        if os.path.exists(os.path.join(root, ".git")):
            try:
                listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
                files = [f for f in listed.decode("utf-8", "replace").split("\0") if f]
                # A tracked file deleted in the work tree is gone for the reader too.
                files = [f for f in files if os.path.lexists(os.path.join(root, f))]
            except (OSError, subprocess.CalledProcessError):
                files = None
        if files is None:
            files = []
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != ".git" and not d.startswith("build"))
                rel = os.path.relpath(dirpath, root)
                files += [f if rel == "." else rel + "/" + f for f in sorted(filenames)]
        self.files = sorted(files)
        self.file_set = set(self.files)
        self.dirs = set()
        for f in self.files:
            parts = f.split("/")
            for k in range(1, len(parts)):
                self.dirs.add("/".join(parts[:k]))
        self.entries = sorted(self.file_set | self.dirs)
        self._text = {}

    def exists(self, rel):
        rel = rel.rstrip("/")
        return rel in self.file_set or rel in self.dirs

    def text(self, rel):
        if rel not in self._text:
            try:
                with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
                    self._text[rel] = f.read()
            except OSError:
                self._text[rel] = ""
        return self._text[rel]

    def ending_with(self, partial):
        """Tracked files whose path is partial or ends with /partial."""
        return [f for f in self.files if f == partial or f.endswith("/" + partial)]


def expand_braces(pattern):
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(pattern[:m.start()] + alt + pattern[m.end():])
    return out


def is_runtime(path):
    return any(fnmatch.fnmatchcase(path, p) for p in RUNTIME_PATTERNS)


def clean_path(raw):
    """A matched path without what ends the sentence around it."""
    path = raw
    while path.endswith((".", ",", "-")) and not path.endswith("/..."):
        path = path[:-1]
    if path.endswith("/..."):
        path = path[:-3]
    return path


# ---- the check ---------------------------------------------------------------------------------

class Checker:
    def __init__(self, tree, quiet):
        self.tree = tree
        self.quiet = quiet
        self.checked = 0
        self.broken = []
        self.warnings = []

    def report(self, where, message):
        self.broken.append("%s: %s" % (where, message))

    def check_target(self, where, shown, candidates, suffix):
        """candidates: the tracked files the reference may mean (one or more); suffix: the NAME or
        LINE after the colon, or None."""
        self.checked += 1
        if not candidates:
            self.report(where, "'%s' does not exist" % shown)
            return
        if suffix is None:
            return
        if any(c.endswith("/") for c in candidates):
            return  # through a placeholder
        files = [c for c in candidates if c in self.tree.file_set]
        if not files:
            self.report(where, "'%s' is a folder, not a file with '%s'" % (shown, suffix))
            return
        if suffix.isdigit():
            self.warnings.append("%s: warning: '%s:%s' names a line number, which moves whenever "
                                     "the lines above it change: name the function instead"
                                     % (where, shown, suffix))
            lines = max(len(self.tree.text(f).splitlines()) for f in files)
            if int(suffix) > lines:
                self.report(where, "'%s' has no line %s (%d lines)" % (shown, suffix, lines))
            return
        for name in suffix.split("::"):
            word = re.compile(r"(?<!\w)%s(?!\w)" % re.escape(name))
            if not any(word.search(self.tree.text(f)) for f in files):
                self.report(where, "'%s' has no '%s'" % (shown, name))
                return

    def resolve_root_path(self, path):
        """The tracked files or folders a path from the root names (empty: none)."""
        found = self.resolve_exactly(path)
        if found:
            return found
        parts = path.split("/")
        for k, part in enumerate(parts):
            if k and PLACEHOLDER_RE.match(part):
                # What follows a placeholder, a :NAME included, is not checked.
                return [p + "/" for p in self.resolve_exactly("/".join(parts[:k]))]
        return []

    def is_program(self, path):
        """path (without an extension) names a program that its folder's CMake files build."""
        folder, name = os.path.split(path)
        if "." in name or not folder or folder not in self.tree.dirs:
            return False
        word = re.compile(r"(?<![\w.-])%s(?![\w.-])" % re.escape(name))
        for f in self.tree.files:
            if os.path.dirname(f) == folder and (f.endswith(".cmake") or os.path.basename(f) == "CMakeLists.txt"):
                code = re.sub(r"#.*", "", self.tree.text(f))  # a program is named in code
                if word.search(code):
                    return True
        return False

    def resolve_exactly(self, path):
        found = []
        for alt in expand_braces(path):
            alt = alt.rstrip("/")
            if "*" in alt or "?" in alt:
                matches = [e for e in self.tree.entries if fnmatch.fnmatchcase(e, alt)]
                if not matches:
                    return []
                found += matches
            elif self.tree.exists(alt) or self.is_program(alt):
                found.append(alt)
            else:
                return []
        return found

    def check_line(self, src, lineno, text, markdown, following=""):
        where = "%s:%d" % (src, lineno)
        if markdown:
            spans = []
            for rx in (MD_LINK_RE, MD_SRC_RE):
                for m in rx.finditer(text):
                    spans.append(m.span())
                    self.check_link(where, src, m.group(1))
            m = MD_DEF_RE.match(text)
            if m:
                spans.append(m.span())
                self.check_link(where, src, m.group(1))
            for a, b in spans:
                text = text[:a] + " " * (b - a) + text[b:]
        taken = []
        for m in PATH_RE.finditer(text):
            taken.append(m.span())
            path = clean_path(m.group(1))
            suffix = m.group(2)
            if is_runtime(path):
                continue
            shown = path
            self.check_target(where, shown, self.resolve_root_path(path), suffix)
        # A NAME in PATH that continues on the next line is read here, where it starts.
        joined = text + " " + re.sub(r"^\s*\*?\s*", "", following)
        for m in NAME_NEAR_PATH_RE.finditer(joined):
            if m.start() >= len(text):
                break
            path = clean_path(m.group(3))
            name = m.group(1) or m.group(2)
            if path in self.tree.file_set:  # a path that does not resolve is reported above
                self.check_target(where, path, [path], name.replace("~", ""))
        for m in NAMED_RE.finditer(text):
            if any(a <= m.start() < b for a, b in taken):
                continue
            partial = m.group(1)
            self.check_target(where, partial, self.tree.ending_with(partial), m.group(2))

    def check_link(self, where, src, target):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target) or target.startswith("#"):
            return  # a web address, mailto:, or an anchor in this page
        target = target.split("#", 1)[0].split("?", 1)[0]
        if not target:
            return
        if target.startswith("/"):
            rel = target.lstrip("/")
        else:
            rel = os.path.normpath(os.path.join(os.path.dirname(src), target)).replace(os.sep, "/")
        self.checked += 1
        if rel.startswith("../") or rel == "..":
            self.report(where, "'%s' does not exist (it leads out of the repository)" % target)
        elif is_runtime(rel):
            self.checked -= 1
        elif not self.resolve_root_path(rel):
            self.report(where, "'%s' does not exist" % target)


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    quiet = False
    args = argv[1:]
    while args:
        a = args.pop(0)
        if a == "--root":
            if not args:
                print("check_comment_refs.py: --root needs a directory", file=sys.stderr)
                return 2
            root = os.path.abspath(args.pop(0))
            if not os.path.isdir(root):
                print("check_comment_refs.py: --root %s: no such directory" % root, file=sys.stderr)
                return 2
        elif a == "--quiet":
            quiet = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            print("check_comment_refs.py: unknown argument %s (see --help)" % a, file=sys.stderr)
            return 2
    tree = Tree(root)
    checker = Checker(tree, quiet)
    scanned = 0
    for rel in tree.files:
        text = tree.text(rel)
        pieces = comments_of(rel, text)
        if pieces is None:
            continue
        scanned += 1
        for k, (lineno, part) in enumerate(pieces):
            # The comment's next line, for a NAME in PATH that wraps.
            following = pieces[k + 1][1] if k + 1 < len(pieces) and pieces[k + 1][0] == lineno + 1 else ""
            checker.check_line(rel, lineno, part, rel.endswith(".md"), following)
    if not quiet:
        for line in checker.warnings:
            print(line)
    for line in checker.broken:
        print(line)
    summary = ("check_comment_refs.py: %d references checked in the comments and docs of %d files: "
               % (checker.checked, scanned))
    if checker.broken:
        print(summary + "%d broken, %d line-number warnings" % (len(checker.broken), len(checker.warnings)))
        return 1
    print(summary + "all resolve (%d line-number warnings)" % len(checker.warnings))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
