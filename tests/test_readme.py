"""The README a newcomer follows: its table of contents lists its sections in order, and every command it
shows (in a code block, or inline as `pytest qualify ...` or `cache-qualify ...`) is one the suite takes as
typed: a `cache-qualify` command parses with the command's own parser, a `pytest qualify` command names
only options pytest and the plugin define and files the checkout holds, a `python -m` module exists.
CONTRIBUTING.md's test command is the one .ci/run reads and runs, word for word.

What each command then does is the business of the tests of that command (the quick start's run, for one,
is run by every whole-qualification test); this one keeps the README from naming what is not there."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cache_qualify.cli import build_parser
from tests.support.labfixtures import REPO
from tests.support.readme import commands, prose_sentences

README = (REPO / "README.md").read_text(encoding="utf-8")
# a program the README shows that belongs to the system, not to the suite
SYSTEM = {"python3", ".", "pip", "apt-get", "cp", "sed", "git", "cd", "export"}
OWN_FILES = ("hosts.yaml", "examples/")   # paths in the checkout; lab.yaml and reports/ are the reader's


def headings(text: str) -> list[str]:
    return re.findall(r"(?m)^## (.+)$", text)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_readme_s_sentences_are_at_most_40_words() -> None:
    sentences = prose_sentences(README)
    assert len(sentences) > 300, len(sentences)   # the prose was read, not skipped
    long = [f"{len(s.split())} words: {s[:80]}..." for s in sentences if len(s.split()) > 40]
    assert not long, "README: sentences over 40 words:\n" + "\n".join(long)


def mapped(text: str) -> set[str]:
    """What the Layout section's map of the package names: the first code span of each of its list items."""
    layout = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"(?m)^- `([\w.]+/?)`:", layout))


def parts_of_the_package(root: Path) -> set[str]:
    """The packages (``name/``) and top-level modules (``name.py``) of the package at `root`."""
    return ({f"{p.name}/" for p in root.iterdir() if (p / "__init__.py").is_file()}
            | {p.name for p in root.glob("*.py") if p.name != "__init__.py"})


def test_the_map_of_the_package_names_every_package_and_module_it_has() -> None:
    parts = parts_of_the_package(REPO / "fixtures" / "cache_qualify")
    assert {"workload/", "emulation/", "sizing/", "validation/", "calibration.py", "sim/"} <= parts, parts
    assert not parts - mapped(README), f"README's map of the package misses {sorted(parts - mapped(README))}"
    assert not mapped(README) - parts, f"README's map names what the package lacks: {sorted(mapped(README) - parts)}"


def test_the_map_check_sees_a_package_left_out(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "data").mkdir()   # a folder without __init__.py is no package
    (tmp_path / "tool.py").write_text("", encoding="utf-8")
    (tmp_path / "__init__.py").write_text("", encoding="utf-8")
    text = "Intro.\n\n## Layout\n\n- `old/`: the old stage;\n- `tool.py`: a tool.\n\n## Next\n\n- `new/`: elsewhere.\n"
    assert parts_of_the_package(tmp_path) == {"old/", "new/", "tool.py"}
    assert mapped(text) == {"old/", "tool.py"}


def test_a_sentence_of_41_words_is_found() -> None:
    line = "word " * 40 + "end."
    assert [len(s.split()) for s in prose_sentences(f"Intro.\n\n{line}\n\n    {line}\n\n| {line} |\n")] == [1, 41]


def test_the_contents_list_every_section_in_order() -> None:
    listed = re.findall(r"(?m)^\s*- \[(.+?)\]\(#(.+?)\)$", README.split("## Contents", 1)[1].split("\n## ", 1)[0])
    sections = [h for h in headings(README) if h != "Contents"]
    assert [title for title, _ in listed] == sections
    assert all(link == anchor(title) for title, link in listed), listed
    # a newcomer's path first: running it, what runs, what it says, a real lab, CI; the rest after
    first = ["Quick start", "What the simulated lab is", "Reading the results", "Pointing the suite at a real lab",
             "Wiring the gate into CI"]
    assert sections[:len(first)] == first and sections.index("Advanced") > len(first), sections


def test_ci_runs_the_contributing_guide_s_test_command_word_for_word() -> None:
    guide = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = guide.split("## Run the suite's own tests", 1)[1]
    command = next(line.strip() for line in section.splitlines() if line.startswith("    apt-get "))
    # .ci/run reads the command from the guide and runs its parts timed: its reading gives this line whole
    reading = next(line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                   if line.startswith("command=$("))
    read = subprocess.run(["bash", "-c", f'set -euo pipefail; {reading}; printf %s "$command"'], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert read.stdout == command
    assert "pytest tests -n 2 --durations=10" in command   # .ci/run's last lines name the slowest ten tests
    assert "apt-get" not in README and "CONTRIBUTING.md" in README   # the newcomer's page points there


def test_every_cache_qualify_command_parses_as_typed() -> None:
    shown = [c for c in commands(README) if c.startswith("cache-qualify ")]
    assert len(shown) >= 15, shown
    for command in shown:
        words = [w.replace("<run-id>", "r1") for w in shlex.split(command.replace("[", "").replace("]", ""))][1:]
        if words[:1] == ["run"]:   # pytest's options, every one after `run`: the slow test below checks them
            continue
        if len(words) == 1:   # a subcommand named in a sentence (`cache-qualify report` draws them)
            choices = build_parser(words)._subparsers._group_actions[0].choices  # type: ignore[union-attr]
            assert words[0] in choices, f"README: no subcommand `{command}`"
            continue
        try:
            build_parser(words).parse_args(words)
        except SystemExit:
            pytest.fail(f"README: `{command}` does not parse")


@pytest.mark.slow
def test_every_pytest_qualify_and_module_command_names_what_exists() -> None:
    """Each `--option` of a `pytest qualify` command is one pytest or the plugin defines (pytest's --help,
    once: about 5 s); each file of the checkout it names exists; each `python -m` module is importable."""
    shown = [part.strip() for c in commands(README) for part in c.split("&&")]
    helped = subprocess.run([sys.executable, "-m", "pytest", "qualify", "--help", "-p", "no:cacheprovider"],
                            cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    defined = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", helped))
    # `cache-qualify run` hands every word after `run` to pytest qualify (the tests the package ships)
    qualify = [p.replace("cache-qualify run", "pytest qualify", 1) for p in shown
               if p.startswith(("pytest qualify", "cache-qualify run"))]
    assert len(qualify) >= 10, qualify
    for command in qualify:
        words = shlex.split(command)
        for word in words:
            option = word.split("=", 1)[0]
            assert not option.startswith("--") or option in defined, f"README: `{command}`: {option}?"
            if word.startswith(OWN_FILES) and word.endswith(".yaml"):
                assert (REPO / word).is_file(), f"README: `{command}`: no {word}"
    for command in shown:
        words = shlex.split(command)
        if words[0] in ("python", "python3") and words[1:2] == ["-m"] and words[2] != "venv":
            assert importlib.util.find_spec(words[2]) is not None, f"README: `{command}`: no module {words[2]}"
        else:
            assert words[0] in SYSTEM | {"pytest", "cache-qualify"}, f"README: `{command}`: what runs it?"
