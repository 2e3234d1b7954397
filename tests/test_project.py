"""The project's own promises: two set-up commands, CI calling the test one, a valid stack."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def test_the_readme_quick_start_is_exactly_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start")[1].split("##")[0]
    [block] = re.findall(r"```(?:bash|sh)?\n(.*?)```", quick_start, re.S)
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert commands == ["./scripts/run", "./scripts/test"]
    for command in commands:
        assert (ROOT / command).stat().st_mode & 0o111, f"{command} is not executable"


def test_ci_runs_the_readme_test_command_and_requires_real_systems() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in ci
    assert "KNEEPOINT_REQUIRE_REAL=1" in ci
