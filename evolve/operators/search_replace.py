"""Parse a model's answer into edits and apply them: SEARCH/REPLACE blocks and whole files.

Models format answers loosely, so parsing tolerates code fences around or inside blocks,
CRLF line ends, trailing spaces, a search text indented differently from the file
(the replacement is re-indented by the same amount), and several blocks per answer.
Matching is exact first and only then tolerant; a search text must match exactly one
place. Every block that does not apply is reported with the reason, so the model can be
told next time.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from evolve.operators.edits import EditError, block_bodies, blocks, outside, replace_blocks

_SEARCH = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH\b.*$")
_DIVIDER = re.compile(r"^[ \t]*={5,9}[ \t]*$")
_REPLACE = re.compile(r"^[ \t]*>{5,9}[ \t]*REPLACE\b.*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_FENCED_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.M | re.S,
)
_PATHLIKE = re.compile(r"[\w./\\-]+\.\w+")


@dataclass(frozen=True)
class SearchReplace:
    """One parsed block: the text to find, its replacement and the file named before it (if any)."""

    search: str
    replace: str
    path: str | None = None
    index: int = 0  # 1-based position in the answer


@dataclass(frozen=True)
class Applied:
    """The result of applying an answer's blocks: the new files and what went wrong per block."""

    files: dict[str, str]
    applied: int
    problems: tuple[str, ...]


def _next_marker(lines: list[str], start: int, marker: re.Pattern[str]) -> int | None:
    """Index of the first line from ``start`` matching ``marker`` or opening a new SEARCH."""
    return next(
        (j for j in range(start, len(lines)) if marker.match(lines[j]) or _SEARCH.match(lines[j])),
        None,
    )


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _strip_fence_lines(lines: list[str]) -> list[str]:
    """Drop code-fence lines that a model put at the edges of a SEARCH or REPLACE section."""
    while lines and _FENCE.match(lines[0]):
        lines = lines[1:]
    while lines and _FENCE.match(lines[-1]):
        lines = lines[:-1]
    return lines


def _path_hint(lines: Sequence[str], known: Sequence[str]) -> str | None:
    """The file named on the last non-empty, non-fence line before a block, if it names a known file."""
    for line in reversed(lines):
        stripped = line.strip()
        if not stripped or _FENCE.match(stripped):
            continue
        for token in _PATHLIKE.findall(stripped):
            token = token.strip("`*'\"").replace("\\", "/").removeprefix("./")
            for path in known:
                if token == path or token.endswith("/" + path) or path.endswith("/" + token):
                    return path
        return None
    return None


def _divider(candidates: list[int], lines: list[str]) -> int | None:
    """The divider among the ======= lines of a block: the only one, or the only unindented one.

    Code inside a SEARCH or REPLACE section may hold such lines (a heading underline in a
    docstring); they are told apart from the divider by their indentation.
    """
    if len(candidates) == 1:
        return candidates[0]
    flush = [j for j in candidates if not lines[j][:1].isspace()]
    return flush[0] if len(flush) == 1 else None


def parse_search_replace(
    answer: str, known_paths: Sequence[str] = ()
) -> tuple[list[SearchReplace], list[str]]:
    """All SEARCH/REPLACE blocks of an answer, and the problems found while parsing.

    A block is ``<<<<<<< SEARCH`` / search lines / ``=======`` / replace lines /
    ``>>>>>>> REPLACE`` (5 to 9 marker characters are accepted). The file a block edits
    may be named on the line before it (``main.py``, ``### File: `main.py```...).
    """
    lines = normalize_newlines(answer).split("\n")
    found: list[SearchReplace] = []
    problems: list[str] = []
    i, since = 0, 0
    while i < len(lines):
        if not _SEARCH.match(lines[i]):
            i += 1
            continue
        start = i
        hint = _path_hint(lines[since:start], known_paths)
        end = _next_marker(lines, start + 1, _REPLACE)
        closed = end is not None and not _SEARCH.match(lines[end])
        stop = len(lines) if end is None else end
        dividers = [j for j in range(start + 1, stop) if _DIVIDER.match(lines[j])]
        divider = _divider(dividers, lines) if closed else None
        if end is None or divider is None:
            if not dividers:
                what = "SEARCH without a ======= divider line"
            elif not closed:
                what = "no closing >>>>>>> REPLACE line"
            else:
                what = (
                    "several ======= lines between SEARCH and REPLACE; put the divider at the "
                    "start of its line and indent any ======= line of the code"
                )
            problems.append(f"block {len(found) + len(problems) + 1}: {what}")
            i = since = end + 1 if closed else (start + 1 if end is None else end)
            continue
        search = _strip_fence_lines(lines[start + 1 : divider])
        replace = _strip_fence_lines(lines[divider + 1 : end])
        found.append(
            SearchReplace(
                search="\n".join(search),
                replace="\n".join(replace),
                path=hint,
                index=len(found) + len(problems) + 1,
            )
        )
        i = since = end + 1
    return found, problems


# --- matching --------------------------------------------------------------------------------------


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _trim_blank_edges(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _windows(
    text_lines: list[str], search_lines: list[str], same: Callable[[str, str], bool]
) -> list[int]:
    n = len(search_lines)
    return [
        i
        for i in range(len(text_lines) - n + 1)
        if all(same(text_lines[i + k], search_lines[k]) for k in range(n))
    ]


def _shift(line: str, shift: int, base: str) -> str:
    """``line`` indented ``shift`` more characters (taken from ``base``), or fewer when negative."""
    if not line.strip():
        return ""
    if shift >= 0:
        return base[:shift] + line
    cut = min(-shift, len(_indent(line)))
    return line[cut:]


def _the_one(hits: list[int]) -> int | None:
    """The only place the search text matched; None when it matched nowhere.

    Raises:
        EditError: it matched in several places.
    """
    if len(hits) > 1:
        raise EditError(
            f"the SEARCH text occurs {len(hits)} times; include more surrounding lines so it is unique"
        )
    return hits[0] if hits else None


def apply_one(text: str, search: str, replace: str) -> str:
    """Replace the one place where ``search`` occurs in ``text``, tolerating formatting noise.

    Tried in order: the exact text; the lines with trailing spaces ignored (and blank
    lines at the edges of the search dropped); the lines with a uniform indentation
    difference, in which case the replacement is shifted by the same amount.

    Raises:
        EditError: the search text is empty, occurs nowhere, or occurs more than once.
    """
    if not search.strip():
        raise EditError("the SEARCH section is empty; quote the exact lines to replace")
    text_lines = text.split("\n")
    replace_lines = [] if not replace.strip() else replace.split("\n")
    exact = search.split("\n")
    search_lines = _trim_blank_edges(exact)
    for lines, same in (
        (exact, operator.eq),
        (search_lines, lambda a, b: a.rstrip() == b.rstrip()),
    ):
        i = _the_one(_windows(text_lines, lines, same))
        if i is not None:
            return "\n".join(text_lines[:i] + replace_lines + text_lines[i + len(lines) :])

    hits = _windows(text_lines, search_lines, lambda a, b: a.strip() == b.strip())
    consistent = []
    for i in hits:
        offsets = {
            (_indent(text_lines[i + k]), _indent(line))
            for k, line in enumerate(search_lines)
            if line.strip()
        }
        shifts = {len(a) - len(b) for a, b in offsets}
        if len(shifts) == 1:
            consistent.append(i)
    i = _the_one(consistent)
    if i is not None:
        first = next(k for k, line in enumerate(search_lines) if line.strip())
        old_base, new_base = _indent(search_lines[first]), _indent(text_lines[i + first])
        shift = len(new_base) - len(old_base)
        shifted = [_shift(line, shift, new_base) for line in replace_lines]
        return "\n".join(text_lines[:i] + shifted + text_lines[i + len(search_lines) :])
    raise EditError(f"the SEARCH text was not found{_closest(text_lines, search_lines)}")


def _closest(text_lines: list[str], search_lines: list[str]) -> str:
    """A hint naming the file line most similar to the first search line that is not in the file.

    The file's line is quoted whole, indentation and runs of spaces kept, so it can be copied.
    """
    stripped = [line.strip() for line in text_lines]
    for line in search_lines:
        if line.strip() and line.strip() not in stripped:
            match = difflib.get_close_matches(line.strip(), stripped, n=1, cutoff=0.6)
            if match:
                number = stripped.index(match[0]) + 1
                return (
                    f"; no line reads {line.rstrip()[:160]!r} "
                    f"(closest, line {number}: {text_lines[number - 1].rstrip()[:160]!r})"
                )
            return f"; no line reads {line.rstrip()[:160]!r}"
    return " as one contiguous run of lines"


def apply_search_replace(
    files: Mapping[str, str], answer: str, editable: Callable[[str], bool]
) -> Applied:
    """Apply every SEARCH/REPLACE block of ``answer`` to ``files``, in order.

    A block goes to the file named before it; without a name, to the one editable file
    whose text contains the search (the only editable file, when there is just one).
    CRLF files keep their line ends. Blocks that fail are skipped and reported; the
    caller decides whether a partial edit is acceptable.
    """
    editable_paths = [p for p in files if editable(p)]
    crlf = {p for p, t in files.items() if "\r\n" in t}
    texts = {p: normalize_newlines(t) for p, t in files.items()}
    parsed, problems = parse_search_replace(answer, list(files))
    applied = 0
    for block in parsed:
        label = f"block {block.index}"
        targets = [block.path] if block.path else editable_paths
        if block.path and not editable(block.path):
            problems.append(
                f"{label}: {block.path} is read-only; edit only {', '.join(editable_paths) or 'nothing'}"
            )
            continue
        if not targets:
            problems.append(f"{label}: no editable file to apply it to")
            continue
        if len(targets) > 1:
            holding = [p for p in targets if _holds(texts[p], block.search)]
            if len(holding) != 1:
                where = "none of" if not holding else "several of"
                problems.append(
                    f"{label}: its SEARCH text is in {where} {', '.join(targets)}; name the file on the line before the block"
                )
                continue
            targets = holding
        path = targets[0]
        try:
            texts[path] = apply_one(texts[path], block.search, block.replace)
            applied += 1
        except EditError as exc:
            problems.append(f"{label} ({path}): {exc}")
    out = {p: (t.replace("\n", "\r\n") if p in crlf else t) for p, t in texts.items()}
    return Applied(files=out, applied=applied, problems=tuple(problems))


def _holds(text: str, search: str) -> bool:
    try:
        apply_one(text, search, "")
    except EditError:
        return False
    return True


# --- whole files ----------------------------------------------------------------------------------


def fenced_blocks(answer: str) -> list[tuple[str | None, str]]:
    """The fenced code blocks of an answer as (file named in or before the fence, code)."""
    text = normalize_newlines(answer)
    found = []
    for match in _FENCED_BLOCK.finditer(text):
        info = match.group("info").strip()
        before = text[: match.start()].rstrip("\n").split("\n")[-1:]
        hint = None
        for candidate in [info, *before]:
            paths = _PATHLIKE.findall(candidate)
            if paths:
                hint = paths[-1].strip("`*'\"").removeprefix("./")
                break
        body = match.group("body")
        indent = match.group("indent")
        if indent:
            body = "\n".join(
                line[len(indent) :] if line.startswith(indent) else line
                for line in body.split("\n")
            )
        found.append((hint, body))
    return found


def splice_rewrite(path: str, old: str, new: str) -> str:
    """Fit a whole-file rewrite of ``old`` into its EVOLVE-BLOCKs.

    Files without blocks are returned as rewritten. For files with blocks, the new
    block bodies are put into the old file, provided the text outside the blocks is
    unchanged up to whitespace (models often re-wrap or strip it).

    Raises:
        EditError: the markers were lost or changed, or code outside the blocks changed.
    """
    if not blocks(old):
        return new
    try:
        bodies = block_bodies(new)
        before, after = outside(old), outside(new)
    except EditError as exc:
        raise EditError(
            f"{path}: the rewrite broke the EVOLVE-BLOCK markers ({exc}); keep them as they are"
        ) from exc
    if len(bodies) != len(blocks(old)):
        raise EditError(
            f"{path}: the rewrite has {len(bodies)} EVOLVE-BLOCKs, the file has {len(blocks(old))}; keep every marker"
        )
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if " ".join(was.split()) != " ".join(now.split()):
            where = "before the first block" if index == 0 else f"after block {index}"
            raise EditError(
                f"{path}: the rewrite changes code outside the EVOLVE-BLOCKs ({where}); only block bodies may change"
            )
    return replace_blocks(old, bodies)
