"""What README.md shows: its command lines and the sentences of its prose, as its tests read them."""

from __future__ import annotations

import re


def commands(text: str) -> list[str]:
    """Every command line the text shows: the lines of its indented and shell-fenced code blocks (a line
    ending in a backslash joined to the next, a trailing comment dropped), then its inline commands."""
    found: list[str] = []
    lines, fence, pending = text.splitlines(), None, ""
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence is not None and fence not in ("", "sh", "bash", "shell"):
            continue
        indented = re.match(r"^ {4,}\S", line) and (not lines[i - 1].strip() or re.match(r"^ {4,}\S", lines[i - 1]))
        if fence is None and not indented:
            continue
        code = pending + " " + line.strip() if pending else line.strip()
        if code.endswith("\\"):
            pending = code[:-1].strip()
            continue
        pending = ""
        code = re.sub(r"\s+#.*$", "", code).strip()
        if code:
            found.append(code)
    found += re.findall(r"`((?:pytest qualify|cache-qualify) [^`]+)`", text)
    return found


def prose_sentences(text: str) -> list[str]:
    """The sentences of the text's prose: its paragraphs and list items, not its code blocks, tables or
    headings. Inline code counts as one word; a link as its words; "e.g." ends no sentence; a sentence
    ends at ".", "!" or "?", or at a colon followed by a capital (a sentence of its own after it)."""
    paragraphs: list[list[str]] = [[]]
    lines, fence = text.splitlines(), False
    for i, line in enumerate(lines):
        fence = not fence if line.startswith("```") else fence
        above = lines[i - 1] if i else ""
        indented = re.match(r"^ {4,}\S", line) and (not above.strip() or re.match(r"^ {4,}\S", above))
        if fence or indented or line.startswith(("```", "|", "#")) or not line.strip() \
                or re.match(r"^\s*([*-]|\d+\.) ", line):
            paragraphs.append([])   # a list item starts a paragraph of its own
        if not (fence or indented or line.startswith(("```", "|", "#"))) and line.strip():
            paragraphs[-1].append(line.strip())
    out = []
    for words in paragraphs:
        paragraph = re.sub(r"`[^`]*`", "CODE", " ".join(words))
        paragraph = re.sub(r"\]\([^)]*\)", "]", re.sub(r"\b(e\.g|i\.e|etc|vs)\.", r"\1", paragraph))
        out += [s for s in re.split(r"(?<=:)\s+(?=[A-Z])|(?<=[.!?])\s+", paragraph) if s.strip()]
    return out
