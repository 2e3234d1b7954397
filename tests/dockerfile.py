"""What the Dockerfile builds, worked out without Docker: its instructions, the build context
that .dockerignore leaves, and the tree its `pip install .` installs from.

Covers the subset of Docker the project's Dockerfile uses (one stage; WORKDIR, ENV, COPY,
RUN, CMD; .dockerignore patterns with `*`, `?`, `**` and `!` exceptions). Anything else in
the Dockerfile is reported as unsupported, so a test never silently reads it wrong."""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

KNOWN = {"FROM", "WORKDIR", "COPY", "RUN", "USER", "ENV", "EXPOSE", "CMD", "LABEL", "ARG"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, `\\` continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        found.append((keyword.upper(), arguments.strip()))
    return found


def words(arguments: str) -> list[str]:
    """An instruction's arguments: the JSON (exec) form or the shell-like form."""
    if arguments.startswith("["):
        parsed = json.loads(arguments)
        assert isinstance(parsed, list)
        return [str(word) for word in parsed]
    return shlex.split(arguments)


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative to the build context
    destination: str  # absolute, in the image


@dataclass
class Image:
    """The parts of a Dockerfile the tests reason about."""

    base: str = ""
    copies: list[Copy] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    install_dirs: list[str] = field(default_factory=list)  # WORKDIR of each `pip install .`
    user: str = "root"
    workdir: str = "/"  # where CMD runs
    cmd: list[str] = field(default_factory=list)


def parse(text: str) -> Image:
    """Read a single-stage Dockerfile; raise ValueError on anything this module can't follow."""
    image = Image()
    for keyword, arguments in instructions(text):
        if keyword not in KNOWN:
            raise ValueError(f"unsupported Dockerfile instruction {keyword}")
        if keyword == "FROM":
            if image.base:
                raise ValueError("multi-stage Dockerfiles are not supported")
            image.base = arguments.split()[0]
        elif keyword == "WORKDIR":
            image.workdir = posixpath.normpath(posixpath.join(image.workdir, arguments))
        elif keyword == "USER":
            image.user = arguments
        elif keyword == "ENV":
            for pair in shlex.split(arguments):
                key, _, value = pair.partition("=")
                image.env[key] = value
        elif keyword == "COPY":
            parts = words(arguments)
            flags = [part for part in parts if part.startswith("--")]
            if any(flag.startswith(("--from", "--parents")) for flag in flags):
                raise ValueError(f"unsupported COPY flags {flags}")
            *sources, destination = [part for part in parts if not part.startswith("--")]
            target = posixpath.normpath(posixpath.join(image.workdir, destination))
            if destination.endswith("/") or destination in (".", "./"):
                target = target.rstrip("/") + "/"
            image.copies.append(Copy(tuple(sources), target))
        elif keyword == "RUN":
            # `pip install [options] .` installs the project from the current WORKDIR.
            for command in re.split(r"&&|;|\|\|", arguments):
                argv = shlex.split(command)
                if "pip" in argv and "install" in argv and "." in argv:
                    image.install_dirs.append(image.workdir)
        elif keyword == "CMD":
            image.cmd = words(arguments)
    return image


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over context-relative paths (Go filepath.Match, plus
    `**` for any number of directories)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out, i = out + "[" + ("^" + body[1:] if body.startswith("^") else body) + "]", end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out, i = out + re.escape(pattern[i + 1]), i + 2
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


@dataclass(frozen=True)
class Ignore:
    """.dockerignore: the last pattern matching a path (or one of its parent folders) decides."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...]  # (is an exception `!`, pattern)

    @classmethod
    def read(cls, root: Path) -> Ignore:
        path = root / ".dockerignore"
        lines = path.read_text().splitlines() if path.exists() else []
        rules = []
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            cleaned = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
            rules.append((exception, pattern_regex(cleaned)))
        return cls(tuple(rules))

    def excludes(self, relative: str) -> bool:
        parts = relative.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for exception, regex in self.rules:
            if any(regex.match(prefix) for prefix in prefixes):
                excluded = not exception
        return excluded

    @property
    def has_exceptions(self) -> bool:
        return any(exception for exception, _ in self.rules)


def context_files(root: Path) -> list[str]:
    """Every file Docker would send as the build context of `root` (posix, relative)."""
    ignore = Ignore.read(root)
    found = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        if not ignore.has_exceptions:  # without `!`, an excluded folder has nothing to send
            dirs[:] = [d for d in dirs if not ignore.excludes(prefix + d)]
        found += [prefix + name for name in files if not ignore.excludes(prefix + name)]
    return sorted(found)


def image_files(root: Path, image: Image) -> dict[str, str]:
    """Image path -> context path of every file the COPY instructions put in the image."""
    sent = context_files(root)
    placed: dict[str, str] = {}
    for copy in image.copies:
        into_folder = copy.destination.endswith("/") or len(copy.sources) > 1
        for source in copy.sources:
            pattern = posixpath.normpath(source).lstrip("/")
            for relative in sent:
                if pattern == ".":
                    inner = relative
                elif fnmatchcase(relative, pattern):
                    inner = PurePosixPath(relative).name if into_folder else ""
                else:
                    under = next(
                        (
                            relative[len(top) + 1 :]
                            for top in _parents(relative)
                            if fnmatchcase(top, pattern)
                        ),
                        None,
                    )
                    if under is None:
                        continue
                    inner = under
                target = posixpath.join(copy.destination, inner) if inner else copy.destination
                placed[posixpath.normpath(target)] = relative
    return placed


def _parents(relative: str) -> list[str]:
    parts = relative.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def install_tree(root: Path, image: Image) -> dict[str, str]:
    """Path under the `pip install .` folder -> context path: what pip installs from."""
    (install_dir,) = image.install_dirs
    return {
        posixpath.relpath(target, install_dir): source
        for target, source in image_files(root, image).items()
        if target.startswith(install_dir.rstrip("/") + "/")
    }


def build_context(root: Path, into: Path) -> Image:
    """Copy into `into` exactly the tree the Dockerfile's `pip install .` sees; return the
    parsed Dockerfile."""
    image = parse((root / "Dockerfile").read_text())
    for inner, source in install_tree(root, image).items():
        (into / inner).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / source, into / inner)
    return image


def included_packages(root: Path) -> list[str]:
    """The top-level packages in `root` that pyproject.toml's setuptools `packages.find`
    includes: what `pip install .` must install."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        path.name
        for path in root.iterdir()
        if path.is_dir()
        and path.name.isidentifier()
        and any(path.glob("*.py"))
        and any(fnmatchcase(path.name, pattern) for pattern in include)
    )
