"""Write the blocking allocator (FairAllocator) from the asyncio one.

    python docs/scripts/async_to_sync.py            # write the generated modules
    python docs/scripts/async_to_sync.py --check    # exit 1 if one is stale

allocator/_sync.py is made from allocator/_async.py, allocator/_sync_admin.py
from allocator/_async_admin.py (:data:`PAIRS`). The blocking allocator is
the asyncio one with ``await`` and ``async`` dropped (``async def``,
``async with``, ``async for``) and a few names renamed (:data:`RENAMES`, the
modules of :data:`PAIRS`, and each asyncio name of allocator/_acompat.py,
``aname`` or ``AName``, to its blocking twin ``name`` or ``Name``; in the
code, and in a string that is just the name, as in ``__all__``). What the
two truly do differently lives in allocator/_acompat.py; where their
docstrings and comments must say different things, :data:`TEXT_RULES`
swaps the asyncio text for the blocking one. The rewrite works on tokens,
so comments, docstrings and layout are kept as written; the names of each
``from ... import`` are then put back in ruff's order, and the run of
relative imports too.

The output is ruff-format clean by construction, with no ruff needed to
make it (CI checks it with only the test dependencies installed): the
rewrite only drops or shortens code, and each source is written so that
its shorter twin is formatted too (a magic trailing comma where a shorter
signature would fit on one line). Where ruff is installed, the
script checks that ``ruff format`` and ``ruff check`` find nothing to
change in the output. A rule that no longer matches anything, a line over
100 characters, or ``asyncio`` left in the output fails the run.

Each source starts with the line ``# the source of allocator/<its twin>: run
docs/scripts/async_to_sync.py after an edit``; in the twin it becomes the
banner ``# generated from allocator/<source> by docs/scripts/async_to_sync.py:
do not edit``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "allocator"
COMPAT = PACKAGE / "_acompat.py"
COMMAND = "python docs/scripts/async_to_sync.py"

#: The asyncio modules of allocator/ and the blocking ones made from them.
PAIRS = [
    ("_async.py", "_sync.py"),
    ("_async_admin.py", "_sync_admin.py"),
    ("_async_keepalive.py", "_sync_keepalive.py"),
]


def source_mark(target: str) -> str:
    """The first line of the source of ``target``."""
    return f"# the source of allocator/{target}: run docs/scripts/async_to_sync.py after an edit"


def banner(source: str) -> str:
    """The first line of the module made from ``source``."""
    return f"# generated from allocator/{source} by docs/scripts/async_to_sync.py: do not edit"


LINE_LENGTH = 100  # pyproject.toml, [tool.ruff]

#: Names in the code (and strings that are just the name) and their blocking twins.
RENAMES = {
    "AsyncFairAllocator": "FairAllocator",
    "AsyncAdmin": "Admin",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "_async_io": "_sync_io",
    "_async_reader": "_sync_reader",
}

#: Text of docstrings and comments (never of f-strings), asyncio's and the
#: blocking allocator's, in the order they are applied. Each must match.
TEXT_RULES: list[tuple[str, str]] = [
    # The module docstring.
    ("the asyncio shell around the core", "the blocking shell around the core"),
    ("thousand waiting tasks use one connection", "thousand waiting threads use one connection"),
    # The methods' docstrings are written once for both classes (a word in
    # parentheses says where asyncio differs): only the names change.
    ("redis.asyncio.", "redis."),
    ("FakeAsyncRedis", "FakeRedis"),
    # Keeper: where keepalive renews from.
    ("every ttl/3 from a task", "every ttl/3 from a daemon thread"),
    # Code samples and names in the text.
    ("async with ", "with "),
    ("AsyncFairAllocator", "FairAllocator"),
]


class RewriteError(Exception):
    """The rewrite cannot be made as the rules say."""


def compat_renames(compat: str) -> dict[str, str]:
    """Each asyncio name of allocator/_acompat.py's ``__all__`` (``aname``,
    ``AName``) whose blocking twin (``name``, ``Name``) is there too."""
    names: list[str] = []
    for node in ast.parse(compat).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = list(ast.literal_eval(node.value))
    return {n: n[1:] for n in names if n[:1] in ("a", "A") and n[1:] in names}


def _offsets(text: str) -> list[int]:
    """The offset in ``text`` of each line's start (tokenize's rows are 1-based)."""
    starts = [0, 0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


class Used:
    """The renames and text rules that matched, over every source."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.rules = [0] * len(TEXT_RULES)

    def check(self) -> None:
        """Every text rule and every name of :data:`RENAMES` matched."""
        unused = [old for (old, _), n in zip(TEXT_RULES, self.rules, strict=True) if not n]
        if unused:
            raise RewriteError(f"text rules that match nothing: {unused!r}")
        missing = sorted(set(RENAMES) - self.names)
        if missing:
            raise RewriteError(f"renames that match nothing: {missing}")


def rewrite(name: str, target: str, source: str, renames: dict[str, str], used: Used) -> str:
    """The source ``name`` with ``await``/``async`` dropped, names renamed and
    the text rules applied, as ``target``; raises :class:`RewriteError` where that
    cannot be done safely."""
    first, _, rest = source.partition("\n")
    if first != source_mark(target):
        raise RewriteError(f"allocator/{name} must start with the line {source_mark(target)!r}")
    source = banner(name) + "\n" + rest
    starts = _offsets(source)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    edits: list[tuple[int, int, str]] = []

    def at(pos: tuple[int, int]) -> int:
        return starts[pos[0]] + pos[1]

    fstring_depth = 0
    for i, tok in enumerate(tokens):
        kind = tokenize.tok_name[tok.type]
        if kind == "FSTRING_START":  # Python >= 3.12: an f-string is many tokens
            fstring_depth += 1
        elif kind == "FSTRING_END":
            fstring_depth -= 1
        if fstring_depth or (tok.type == tokenize.STRING and _is_fstring(tok.string)):
            _refuse_in_fstring(tok.string, renames)
            continue
        if tok.type == tokenize.NAME and tok.string in ("await", "async"):
            following = tokens[i + 1]
            if tok.string == "async" and following.string not in ("def", "with", "for"):
                raise RewriteError(f"{name}:{tok.start[0]}: async {following.string}")
            # The keyword and the space after it.
            edits.append((at(tok.start), at(following.start), ""))
        elif tok.type == tokenize.NAME and tok.string in renames:
            used.names.add(tok.string)
            edits.append((at(tok.start), at(tok.end), renames[tok.string]))
        elif tok.type == tokenize.STRING and tok.string[1:-1] in renames:  # as in __all__
            used.names.add(tok.string[1:-1])
            quote = tok.string[0]
            edits.append((at(tok.start), at(tok.end), quote + renames[tok.string[1:-1]] + quote))
        elif tok.type in (tokenize.STRING, tokenize.COMMENT):
            text = tok.string
            for n, (old, new) in enumerate(TEXT_RULES):
                used.rules[n] += text.count(old)
                text = text.replace(old, new)
            if text != tok.string:
                edits.append((at(tok.start), at(tok.end), text))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def _is_fstring(string: str) -> bool:
    prefix = re.match(r"[A-Za-z]*", string)
    return prefix is not None and "f" in prefix.group(0).lower()


def _refuse_in_fstring(string: str, renames: dict[str, str]) -> None:
    """Python 3.11 keeps an f-string whole and 3.12 splits it: rewriting
    inside one would give each a different output, so nothing is rewritten
    there, and what would be is refused."""
    words = set(re.findall(r"\w+", string))
    found = words & {"await", "async", *renames}
    found |= {old for old, _ in TEXT_RULES if old in string}
    if found:
        raise RewriteError(
            f"an f-string holds what the rewrite changes: {sorted(found)} in {string!r}"
        )


# -- the imports, in ruff's (isort's) order again --------------------------------


def _natural(text: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _member_key(name: str) -> tuple[object, ...]:
    """ruff's order of the names of a ``from`` import (order-by-type):
    CONSTANTS, then Classes, then the rest; case-insensitive, naturally."""
    if len(name) > 1 and name.upper() == name and name.lower() != name:
        rank = 0
    elif name[:1].isupper():
        rank = 1
    else:
        rank = 2
    return (rank, _natural(name.lower()), _natural(name))


def _module_key(node: ast.ImportFrom) -> tuple[object, ...]:
    """ruff's order of relative imports: furthest first, then by module."""
    module = node.module or ""
    return (-node.level, _natural(module.lower()), _natural(module))


def sort_imports(text: str) -> str:
    """Put the names of each top-level ``from`` import in order, and the
    runs of relative imports (one statement after the other) too."""
    lines = text.splitlines(keepends=True)
    imports = [n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom)]
    # The names of each import; statements are rebuilt last-first.
    for node in reversed(imports):
        names = [alias.name for alias in node.names]
        if any(alias.asname for alias in node.names) or names == ["*"]:
            continue
        ordered = sorted(names, key=_member_key)
        if ordered == names:
            continue
        head = f"from {'.' * node.level}{node.module or ''} import "
        if node.lineno == node.end_lineno:
            body = head + ", ".join(ordered) + "\n"
        else:
            body = head + "(\n" + "".join(f"    {name},\n" for name in ordered) + ")\n"
        lines[node.lineno - 1 : node.end_lineno] = [body]
    text = "".join(lines)
    lines = text.splitlines(keepends=True)
    relative = [n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom) and n.level]
    runs: list[list[ast.ImportFrom]] = []
    for node in relative:
        end = runs[-1][-1].end_lineno if runs else None
        if end is not None and node.lineno == end + 1:
            runs[-1].append(node)
        else:
            runs.append([node])
    for run in reversed(runs):
        chunks = ["".join(lines[n.lineno - 1 : n.end_lineno]) for n in run]
        keys = [_module_key(n) for n in run]
        ordered = [chunk for _, chunk in sorted(zip(keys, chunks, strict=True))]
        start, end = run[0].lineno - 1, run[-1].end_lineno
        assert end is not None
        lines[start:end] = ordered
    return "".join(lines)


# -- checks of the output ---------------------------------------------------------


def check_output(target: str, text: str) -> None:
    """The output compiles, keeps to the line length, and names nothing of
    asyncio."""
    compile(text, target, "exec")
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > LINE_LENGTH:
            raise RewriteError(f"{target}:{number} is {len(line)} characters long")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME and tok.string in ("asyncio", "await", "async"):
            raise RewriteError(f"{target}:{tok.start[0]} still says {tok.string}")


def ruff() -> list[str] | None:
    """How to run ruff here, if it is installed."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else None


def check_with_ruff(
    name: str, target: str, text: str, run: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """``ruff format`` leaves the output as it is, and ``ruff check`` finds
    nothing in it (with the project's settings)."""
    command = ruff()
    if command is None:
        return
    where = ["--stdin-filename", f"allocator/{target}", "-"]
    formatted = run([*command, "format", *where], input=text)
    if formatted.returncode != 0 or formatted.stdout != text:
        raise RewriteError(
            f"ruff format would change {target} ({formatted.stderr.strip() or 'see the diff'}):"
            f" write {name} so that its blocking twin is formatted too"
        )
    linted = run([*command, "check", "--no-fix", "--quiet", *where], input=text)
    if linted.returncode != 0:
        raise RewriteError(f"ruff check finds fault with {target}:\n{linted.stdout}{linted.stderr}")


def generate() -> dict[str, str]:
    """The text each generated module must have, by its name."""
    renames = {**RENAMES, **compat_renames(COMPAT.read_text(encoding="utf-8"))}
    renames.update((name.removesuffix(".py"), twin.removesuffix(".py")) for name, twin in PAIRS)
    used = Used()

    def run(args: list[str], input: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, input=input, capture_output=True, text=True, cwd=ROOT)

    made = {}
    for name, target in PAIRS:
        source = (PACKAGE / name).read_text(encoding="utf-8")
        text = sort_imports(rewrite(name, target, source, renames, used))
        check_output(target, text)
        check_with_ruff(name, target, text, run)
        made[target] = text
    used.check()
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1, changing nothing, if a module is stale"
    )
    args = parser.parse_args()
    try:
        made = generate()
    except RewriteError as exc:
        print(f"async_to_sync: {exc}", file=sys.stderr)
        return 2
    sources = {target: name for name, target in PAIRS}
    stale = []
    for target, text in made.items():
        path = PACKAGE / target
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(target)
            if not args.check:
                path.write_text(text, encoding="utf-8")
                print(f"wrote allocator/{target}")
    if args.check and stale:
        what = ", ".join(f"allocator/{t} (from allocator/{sources[t]})" for t in stale)
        print(f"stale, not what its source makes: {what}: run {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
