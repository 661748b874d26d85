"""The `cache-qualify` command: every subcommand's parser builds from its module of `cache_qualify.cli`,
and no module of the library builds a parser of the command."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from cache_qualify import cli
from cache_qualify.cli import main
from tests.support.labfixtures import run_cli

PACKAGE = Path(cli.__file__).resolve().parent.parent


def test_the_command_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="0"):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: cache-qualify") and "the suite's tools, each a subcommand" in out
    for name in cli._OWNERS:
        assert f"    {name}" in out, name


@pytest.mark.parametrize("name", sorted(set(cli._OWNERS) - {"run"}))   # run's words are pytest's: below
def test_each_subcommand_describes_itself(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="0"):
        main([name, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: cache-qualify {name}")
    description = out.split("\n\n")[1]
    assert len(description) > 30 and not description.lstrip().startswith(("-h", "positional", "options")), out


def test_run_hands_its_words_to_pytest() -> None:
    """`cache-qualify run --help` is pytest's help, with the qualification's options (`cache_qualify.cli.run`)."""
    proc = run_cli("run", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ") and "RowCache policy qualification" in proc.stdout
    assert "--candidate" in proc.stdout and "--junit-xml" in proc.stdout


def test_no_library_module_adds_a_subcommand() -> None:
    """`register(subparsers)` lives in cache_qualify.cli only: the library takes values, not argv."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr == "add_parser"]
    assert not found, "subcommands added outside cache_qualify.cli: " + ", ".join(found)


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit, match=r"^0$"):
        main(["--version"])
    assert capsys.readouterr().out == f"cache-qualify {version('cache-qualify')}\n"


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly() -> None:
    """`cache-qualify plan ... | head`: the write into the closed pipe is no traceback, and the status is
    the shell's for a closed pipe (the reader is closed before the command has written anything)."""
    proc = subprocess.Popen([sys.executable, "-m", "cache_qualify.cli", "plan", "--effect", "0.01", "--sd", "0.002"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (cli.BROKEN_PIPE, "")
