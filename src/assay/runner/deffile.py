"""Read an Apptainer / Singularity definition file (``detector.def``): the subset TrojAI performers use.

Why our own reader: no apptainer can be installed here, yet every TrojAI performer has a ``detector.def``
(trojai-example's: ``Bootstrap: docker``, ``From:``, ``%files``, ``%post``, ``%runscript``). This module only
parses; ``assay.runner.imagebuild`` builds what it returns with podman. The grammar follows apptainer's own
parser (``pkg/build/types/parser/deffile.go``):

- a header of ``Key: value`` lines before the first section (keys case-insensitive, ``#`` starts a
  comment); ``Bootstrap`` is ``docker`` (``From`` an image reference) or ``localimage`` (``From`` a path);
- a section starts at a line whose first word begins with ``%`` (names case-insensitive, anything after the
  name its arguments, a ``#`` ending them); a section named twice is the two bodies joined, as apptainer does;
- ``%files`` lines are ``SOURCE [DESTINATION]`` (quotes group words; blank and ``#`` lines skipped; no
  destination: the source's own path inside the image);
- ``%post``, ``%environment``, ``%runscript`` and ``%help`` are kept as written; ``%post``'s arguments go to
  its shell (``-c /bin/bash``), ``%runscript``'s onto its ``#!`` line;
- ``%labels`` lines are ``KEY VALUE``.

Everything else apptainer knows (``%setup``, ``%pre``, ``%test``, ``%startscript``, ``%arguments``, the
``%app*`` sections, other bootstrap agents, other header keys, several stages) is refused before anything
is built, in one line naming the file, the line and what is supported.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from assay import textfile
from assay.errors import UserError, shown

BOOTSTRAPS = ("docker", "localimage")
SECTIONS = ("files", "post", "environment", "runscript", "labels", "help")
HEADER_KEYS = ("bootstrap", "from")
_SUPPORTED = ", ".join(f"%{name}" for name in SECTIONS)
_ARGUMENTS_ALLOWED = frozenset({"post", "runscript"})  # apptainer reads no other section's arguments
_STAGE = re.compile(r"bootstrap\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class FileCopy:
    """One ``%files`` line: a host source (a path or glob), where it goes ("" for its own path), its line."""

    source: str
    dest: str
    line: int


@dataclass(frozen=True)
class Script:
    """A script section as written, the arguments after its name and the line its header is on."""

    text: str
    args: str
    line: int


@dataclass(frozen=True)
class Definition:
    """What a definition file asks for: the base image, the files, the scripts and the labels."""

    path: Path
    bootstrap: str
    source: str  # the From: value, an image reference or a path
    from_line: int
    runscript: Script
    files: tuple[FileCopy, ...] = ()
    post: Script | None = None
    environment: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    help: str = ""
    raw: str = field(default="", repr=False)


def _strip_comment(text: str) -> str:
    return text.split("#", 1)[0].strip()


def _header(lines: list[tuple[int, str]], where: Path) -> dict[str, tuple[str, int]]:
    """``Key: value`` lines into {key: (value, line)}; unknown keys refused."""
    found: dict[str, tuple[str, int]] = {}
    for number, raw in lines:
        text = _strip_comment(raw)
        if not text:
            continue
        if ":" not in text:
            raise UserError(f"{where}:{number}: header line {shown(text)} is not 'Key: value'")
        key, value = (part.strip() for part in text.split(":", 1))
        if key.lower() not in HEADER_KEYS:
            raise UserError(
                f"{where}:{number}: header key {key!r} is not supported (supported: Bootstrap, From)"
            )
        if value.endswith("\\"):
            raise UserError(f"{where}:{number}: a header value continued on the next line is not supported")
        found[key.lower()] = (value, number)
    return found


def _sections(lines: list[str], where: Path) -> tuple[list[tuple[int, str]], dict[str, list[Script]]]:
    """Split the file into its header lines and its sections' bodies, refusing unsupported sections."""
    header: list[tuple[int, str]] = []
    sections: dict[str, list[Script]] = {}
    current: tuple[str, str, int] | None = None
    body: list[str] = []

    def close() -> None:
        if current is not None:
            name, args, line = current
            sections.setdefault(name, []).append(Script("".join(f"{text}\n" for text in body), args, line))

    for number, text in enumerate(lines, start=1):
        words = text.split(None, 1)
        if words and words[0].startswith("%"):
            close()
            name = words[0][1:].lower()
            args = _strip_comment(words[1]) if len(words) > 1 else ""
            if name not in SECTIONS:
                raise UserError(
                    f"{where}:{number}: section {words[0]!r} is not supported (supported: {_SUPPORTED})"
                )
            if args and name == "files":
                raise UserError(
                    f"{where}:{number}: '%files {args}': copying from another build stage is not supported"
                )
            if args and name not in _ARGUMENTS_ALLOWED:
                raise UserError(f"{where}:{number}: section '%{name}' takes no arguments (value: {args!r})")
            current, body = (name, args, number), []
        elif current is None:
            header.append((number, text))
        elif _STAGE.match(text):
            raise UserError(
                f"{where}:{number}: a second 'Bootstrap:' starts another build stage; multi-stage "
                "definition files are not supported"
            )
        else:
            body.append(text)
    close()
    return header, sections


def _files(scripts: list[Script], where: Path) -> tuple[FileCopy, ...]:
    """Every ``%files`` line of every ``%files`` section, in order."""
    copies = []
    for script in scripts:
        for offset, raw in enumerate(script.text.split("\n"), start=1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            number = script.line + offset
            try:
                words = shlex.split(text, comments=False, posix=True)
            except ValueError as exc:
                raise UserError(f"{where}:{number}: %files line {shown(text)}: {exc}") from None
            if len(words) > 2:
                raise UserError(
                    f"{where}:{number}: %files line {shown(text)} is not 'SOURCE [DESTINATION]' "
                    "(quote a path holding spaces)"
                )
            copies.append(FileCopy(words[0], words[1] if len(words) == 2 else "", number))
    return tuple(copies)


def _labels(scripts: list[Script]) -> tuple[tuple[str, str], ...]:
    labels: dict[str, str] = {}
    for script in scripts:
        for raw in script.text.split("\n"):
            text = raw.strip()
            if text and not text.startswith("#"):
                key, _, value = text.partition(" ")
                labels[key.strip()] = value.strip()
    return tuple(labels.items())


def _joined(scripts: list[Script]) -> Script | None:
    """A section named more than once: its bodies joined (apptainer's rule), the first header's line."""
    if not scripts or not any(s.text.strip() for s in scripts):
        return None
    return Script("".join(s.text for s in scripts), scripts[0].args, scripts[0].line)


def parse_text(text: str, where: Path) -> Definition:
    """Parse a definition file's ``text``; ``where`` names it in errors (one line: file, line, what)."""
    header_lines, sections = _sections(text.splitlines(), where)
    header = _header(header_lines, where)
    if "bootstrap" not in header:
        raise UserError(f"{where}: no 'Bootstrap:' header (supported: {', '.join(BOOTSTRAPS)})")
    bootstrap, line = header["bootstrap"]
    if bootstrap.lower() not in BOOTSTRAPS:
        raise UserError(
            f"{where}:{line}: field 'Bootstrap' {shown(bootstrap)} is not supported "
            f"(supported: {', '.join(BOOTSTRAPS)}; no registry is reachable from here)"
        )
    source, from_line = header.get("from", ("", line))
    if not source:
        raise UserError(f"{where}:{from_line}: no 'From:' header: name the base image")
    runscript = _joined(sections.get("runscript", []))
    if runscript is None:
        raise UserError(
            f"{where}: no %runscript section: a submission runs its runscript "
            "(e.g. '%runscript' then 'exec python3 /entrypoint.py \"$@\"')"
        )
    post = _joined(sections.get("post", []))
    if post is not None and post.args.split()[-1:] == ["-c"]:
        raise UserError(f"{where}:{post.line}: '%post -c' needs a shell after it (e.g. '%post -c /bin/bash')")
    environment = _joined(sections.get("environment", []))
    help_text = _joined(sections.get("help", []))
    return Definition(
        path=where,
        bootstrap=bootstrap.lower(),
        source=source,
        from_line=from_line,
        runscript=runscript,
        files=_files(sections.get("files", []), where),
        post=post,
        environment=environment.text if environment else "",
        labels=_labels(sections.get("labels", [])),
        help=help_text.text if help_text else "",
        raw=text,
    )


def parse_definition(path: str | Path) -> Definition:
    """Read and parse the definition file at ``path`` (UTF-8); one ``UserError`` line for anything wrong."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: a folder; give the definition file (e.g. {path / 'detector.def'})")
    return parse_text(textfile.read(path, "definition file"), path)


def runscript_file(script: Script) -> str:
    """``/.singularity.d/runscript`` as apptainer writes it: the script's own ``#!`` line or ``#!/bin/sh``
    (with the section's arguments after it), a blank line, the script."""
    shebang, text = "#!/bin/sh", script.text
    if script.text.strip().startswith("#!"):
        first, _, text = script.text.lstrip().partition("\n")
        shebang = first.strip()
    if script.args:
        shebang += " " + script.args
    return f"{shebang}\n\n{text}\n"


def environment_file(environment: str) -> str:
    """``/.singularity.d/env/90-environment.sh`` as apptainer writes it."""
    return f"#!/bin/sh\n\n{environment}\n"


def post_command(script: Script, path: str) -> list[str]:
    """How apptainer runs ``%post`` (the script written to ``path``): ``/bin/sh -ex PATH``, the section's
    arguments before it; with ``-c SHELL ARGS`` the script becomes the last word of that command."""
    params = script.args.split()
    if "-c" in params[:-1]:
        at = params.index("-c")
        return ["/bin/sh", "-ex", *params[: at + 1], " ".join(params[at + 1 :]) + " " + path]
    return ["/bin/sh", "-ex", *params, path]
