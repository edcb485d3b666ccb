"""Argument types, one-line errors and output-path checks of the ``fedprivopt`` command line.

Shared by :mod:`fedprivopt.cli` and :mod:`fedprivopt.deploy.cli`: every error is one line on stderr
with exit code :data:`EXIT_USAGE` that names the flag, key or file and its valid range; values the
user typed are echoed shortened (:func:`shown`).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# re-exported: their public path before cli_task_errors (docs/RELIABILITY.md names it)
from fedprivopt.cli_task_errors import name_task_param, task_param_error
from fedprivopt.core.checks import interval
from fedprivopt.core.files import on_read_only_fs, url_refusal
from fedprivopt.core.text import SHOWN_CHARS, cut_middle, shown

__all__ = [
    "DELTA",
    "EXIT_USAGE",
    "LIMIT_ERRNOS",
    "POSITIVE",
    "RATE",
    "SEED",
    "HelpFormatter",
    "Parser",
    "UsageError",
    "check_out_dir",
    "describe_os_error",
    "float_range",
    "int_at_least",
    "int_in",
    "is_file_error",
    "name_task_param",
    "one_line",
    "preset_path",
    "shown",
    "shown_path",
    "task_param_error",
]

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input: reported on one line, exit code 2."""


_QUOTED = 2 * SHOWN_CHARS  # quoted values this long or longer are shortened
# a value starts right after its opening quote with a non-blank character: the text between two
# quoted words (which starts with a blank after the first closing quote) is not taken for one
# a quote opens a value only where no letter precedes it and closes one only where none follows:
# an apostrophe ("the head's host") is no quote (thirty-sixth review of issue 15, found by the
# docs reviewer: a sentence with two apostrophes 165 characters apart was cut as a value)
_LONG_QUOTED = re.compile(
    rf"(?<!\w)'([^'\s][^'\n]{{{_QUOTED - 1},}})'(?!\w)"
    rf"|(?<!\w)\"([^\"\s][^\"\n]{{{_QUOTED - 1},}})\"(?!\w)"
)
_MAX_LINE = 2000
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _shorten(text: str) -> str:
    """``text`` with each quoted value of 160+ characters cut to 80 and its length.

    As :func:`~fedprivopt.core.text.shown` does, both ends are kept and the middle is cut: a
    path's tail names its file.

    A line still longer than 2,000 characters (a long value with quotes inside) keeps its first
    1,500 and last 400 characters.
    """

    def cut(match: re.Match) -> str:
        value = match.group(1) if match.group(1) is not None else match.group(2)
        quote = match.group(0)[0]
        return f"{quote}{cut_middle(value)}{quote} ({len(value):,} characters)"

    text = _LONG_QUOTED.sub(cut, text)
    if len(text) > _MAX_LINE:
        text = f"{text[:1500]} … {text[-400:]}"
    return text


def one_line(text: str) -> str:
    r"""``text`` on one line, line breaks written ``\n`` and long values shortened.

    Line breaks come e.g. from a value the user typed; see :func:`_shorten` for the values.
    """
    return _shorten("\\n".join(text.splitlines()))


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store``, refusing a flag given again with another value.

    ``--mean-trials 2 --mean-trials 9`` silently took the last value (tenth review of issue 15,
    finding 5), as ``--set`` did before the eighth review; the same value twice is harmless.
    """

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = getattr(parser, "_given", None)
        if option_string is not None and given is not None:
            if self.dest in given and given[self.dest] != values:
                raise argparse.ArgumentError(
                    self,
                    f"given twice ({shown(given[self.dest])}, then {shown(values)}); give it once",
                )
            given[self.dest] = values
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr and exit code 2.

    A flag that stores one value may be given once (again only with the same value): its
    ``store`` action is :class:`_StoreOnce`. Numbers such as ``-1e-300`` are read as values,
    not as unknown flags, so their type names the valid range.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        # argparse takes "-1" and "-.5" for numbers but "-1e-300" for a flag ("expected one
        # argument"); this parser has no flag that looks like a number
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, remembering the flags of this parse for :class:`_StoreOnce`."""
        self._given: dict[str, object] = {}
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        """argparse's, but arguments left over are refused by the command they were given to.

        Thirty-sixth review of issue 15 (cli, finding 4): ``fedprivopt epsilon … extra`` (also
        a second preset, ``simulate --version``) was refused as ``fedprivopt: error:
        unrecognized arguments: extra``, the one usage line that named no command.
        """
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(namespace).error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def _chosen(self, namespace: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost (sub)command's parser that ``namespace`` was parsed by."""
        parser: argparse.ArgumentParser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(namespace, subs[0].dest, None) if subs else None
            if name not in (subs[0].choices if subs else {}):
                return parser
            parser = subs[0].choices[name]

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit with :data:`EXIT_USAGE`."""
        self.exit(EXIT_USAGE, f"{one_line(f'{self.prog}: error: {message}')}\n")

    def _print_message(self, message: str, file=None) -> None:
        """argparse's, but a failure to write standard output ends the program as a command's.

        Thirty-first review of issue 15: argparse drops an ``OSError`` of its help and version
        text, so ``fedprivopt --help > /dev/full`` (also ``simulate --help``, ``--version``, a
        bare ``fedprivopt``; a full disk under the redirected output) ended with rc 0 and
        nothing written. Now one line and rc 2 (141 when the pipe's reader left), as
        :func:`~fedprivopt.cli_stdout.stdout_failed` reports a command's own output. Standard
        error's failures are still dropped (diagnostics with nowhere to go).
        """
        import sys

        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
            if file is sys.stdout:
                file.flush()
        except (AttributeError, OSError) as exc:
            if file is not sys.stdout or not isinstance(exc, OSError):
                return
            from fedprivopt.cli_stdout import StdoutError, stdout_failed

            command = self.prog.removeprefix("fedprivopt").strip()
            raise SystemExit(stdout_failed(command, StdoutError(exc))) from None


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help text as written, with every flag's default that is a value.

    Twenty-ninth review of issue 15: argparse appended ``(default: None)`` to 48 flags, where
    the default is decided later (``--out DIR  run directory (default
    runs/<strategy>-seed<S>) (default: None)``, ``--nb-shape … (default 1) (default: None)``,
    a required ``CONFIG``) and ``(default: False)`` to switches. A help that states its own
    default, and a default of ``None`` or ``False``, get no second one.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return action.help
        return super()._get_help_string(action)


# ---------------------------------------------------------------------------------------------
# files and errors: what the top-level handler reports as one line, and checks before any work

NAME_MAX = 255  # bytes in one path component (Linux, macOS and Windows file systems)
_FILE_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)  # fmt: skip


def check_path_text(text: str, flag: str) -> Path:
    """``text`` as a path, refused (:class:`UsageError` naming ``flag``) when it cannot be one.

    An empty path, a control character (a line break pasted along), a component that is only
    blanks (``" "``, ``runs/ /x``: a quoting slip, not a name) or one longer than
    :data:`NAME_MAX` bytes. Nothing is looked up on disk.
    """
    if not text:
        raise UsageError(f"argument {flag}: must be a path, got ''")
    refused = url_refusal(f"argument {flag}:", text)
    if refused is not None:  # forty-third review of issue 15 (input 5): ./s3:/bucket/run
        raise UsageError(refused)
    expanded = os.path.expanduser(text)
    if text.startswith("~") and expanded == text:
        # forty-second review of issue 15 (input 5): --out "~nosuchuser/x" (also --resume,
        # data info, data synth --out) ended in pathlib's "Could not determine home
        # directory." traceback, rc 1
        raise UsageError(
            f"argument {flag}: {shown(text)} starts with ~, but names no user of this machine "
            "whose home it could be; name the directory (./~x for a name that starts with ~)"
        )
    path = Path(expanded)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise UsageError(
            f"argument {flag}: the path holds a control character (a line break?): {shown(text)}"
        )
    for part in path.parts:
        if not part.strip():
            raise UsageError(f"argument {flag}: a path component is blank: {shown(text)}")
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            raise UsageError(
                f"argument {flag}: a path component is {size} bytes long, the limit is "
                f"{NAME_MAX}: {shown(part)}"
            )
    return path


def preset_path(text: str) -> str:
    """Argparse type of a preset file: ``text`` with a leading ``~`` expanded, as ``--out``'s is.

    Twenty-eighth review of issue 15: ``simulate "~/x.toml"`` (quoted, so the shell left the
    ``~``; also ``compare``, ``tune``, ``deploy local``) was refused as ``config file
    '~/x.toml' does not exist`` while ``--out "~/x"`` wrote into the home directory. Every
    other check (empty, unreadable, not a file) is the config loader's, naming the file.
    """
    return os.path.expanduser(text)


def check_out_dir(text: str, flag: str = "--out") -> Path:
    """``text`` as an output directory, checked before anything is computed or written.

    Refused (:class:`UsageError` naming ``flag``): an empty path or a component that is only
    blanks (``--out " "``, ``runs/ /x``: a quoting slip, not a name); a component longer than
    :data:`NAME_MAX` bytes; a path that exists and is not a directory, or lies under a regular
    file; a directory (or its nearest existing ancestor, where it would be created) that this
    user cannot write. What cannot be known without writing (``/proc``, ``/sys``) fails when the
    directory is created and is reported by :func:`main` as one line naming the path.
    """
    path = check_path_text(text, flag)
    if path.is_symlink() and not path.exists():
        if _loops(path):  # thirty-seventh review of issue 15 (cli, finding 4): L -> L
            raise UsageError(
                f"argument {flag}: {shown(text)} is a symbolic link that leads back to itself "
                f"({shown(os.readlink(path))}; too many levels of symbolic links)"
            )
        raise UsageError(f"argument {flag}: {shown(text)} is a symbolic link to nothing")
    probe = path.absolute()
    while True:
        try:
            mode = probe.stat().st_mode
            break
        except (FileNotFoundError, NotADirectoryError):
            if probe.is_symlink():  # sixteenth review of issue 15: "L: exists and is not a ..."
                raise UsageError(
                    f"argument {flag}: cannot create {shown(text)}: {shown(str(probe))} is a "
                    f"symbolic link to nothing ({shown(os.readlink(probe))})"
                ) from None
            probe = probe.parent  # "/" always exists: the loop ends
        except OSError as exc:
            raise UsageError(
                f"argument {flag}: cannot use {shown_path(probe)}: {exc.strerror}"
            ) from None
    if not stat.S_ISDIR(mode):
        if probe == path.absolute():
            raise UsageError(f"argument {flag}: {shown(text)} exists and is not a directory")
        raise UsageError(
            f"argument {flag}: cannot create {shown(text)}: {shown(str(probe))} is not a directory"
        )
    _refuse_inside_a_run(path, flag)
    if not os.access(probe, os.W_OK | os.X_OK):
        # sixteenth review of issue 15: a read-only file system was reported as "permission
        # denied" (access() fails with EROFS, for root too)
        why = "read-only file system" if on_read_only_fs(probe) else "permission denied"
        raise UsageError(f"argument {flag}: cannot write in {shown_path(probe)} ({why})")
    return path


def _loops(path: Path) -> bool:
    """Whether resolving symbolic link ``path`` goes round a loop (``L -> L``, ``A -> B -> A``)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _refuse_inside_a_run(path: Path, flag: str) -> None:
    """Refuse an output directory strictly inside a run directory (one holding its files).

    Sixteenth review of issue 15: ``simulate --out RUN/sub`` (also ``compare``, ``tune``,
    ``deploy local``; ``C/runs/CELL/x`` inside a comparison's cell) wrote a run among another
    run's files (rc 0), after which ``compare --overwrite`` refused that cell for holding it.
    A comparison's or tuning's own directory may still hold other directories, and a directory
    that holds only ``run.lock`` is a run when another process holds it.
    """
    # the checks the Python API's simulate and deploy_local make too (simulation.run_places):
    # the parents as written and as links resolve, a run known by its ledger or its lock beside
    # its config, and a directory another process holds with only run.lock written yet
    # (forty-first review follow-up, outputs, open for the lead)
    from fedprivopt.data.locks import LockHeldError
    from fedprivopt.deploy.out_checks import refuse_inside_writing
    from fedprivopt.simulation.run_places import refuse_inside_a_run, refuse_inside_held

    try:
        refuse_inside_a_run(path, flag)
        refuse_inside_held(path, flag)
        # a comparison or tuning another process is writing (forty-fifth review, lead 3)
        refuse_inside_writing(path, flag, own_ok=True)
    except (ValueError, LockHeldError) as exc:
        raise UsageError(str(exc)) from None


def shown_path(path: object) -> str:
    """``path`` for a message: as it is, or quoted with its middle cut when it is long.

    Thirty-sixth review of issue 15 (cli, finding 1): ``simulate toy.toml --out P``, P a path
    of about 5,000 characters that cannot be created, echoed ~1,900 characters of it (paths in
    file-system errors are not quoted, so :func:`one_line` did not cut them).
    """
    text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    if len(text) < _QUOTED:
        return text
    return f"'{cut_middle(text)}' ({len(text):,} characters)"


def describe_os_error(exc: OSError) -> str:
    """One line for a file-system error: the path(s) (:func:`shown_path`) and the reason."""
    if exc.errno in LIMIT_ERRNOS:
        return _limit_reached(exc)
    if exc.filename is None:
        return str(exc)  # raised with a message of ours, e.g. a task's missing data files
    names = shown_path(exc.filename) + (
        f" -> {shown_path(exc.filename2)}" if exc.filename2 is not None else ""
    )
    if isinstance(exc, FileExistsError) and not os.path.isdir(exc.filename):
        return f"{names}: exists and is not a directory"  # mkdir(exist_ok=True) on a file
    return f"{names}: {exc.strerror or exc}"


#: errnos of a file system that cannot take more data, whatever the call (a ``flush`` or
#: ``os.pwrite`` carries no file name): fourteenth review of issue 15, a full disk mid-run
#: ended in a 40-line traceback (rc 1).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
#: errnos of a file that cannot be read or written whatever the call: EIO (a failing disk or
#: file server, also ``/proc/self/mem`` given as a file) ended in a traceback, rc 1 (sixteenth
#: review of issue 15)
_IO_ERRNOS = frozenset({errno.EIO})


#: errnos of a limit of open files, whatever the call (``os.pipe`` of a worker, a socket, a file):
#: thirty-seventh review of issue 15 (cli, finding 1; the environment reviewer's report),
#: ``ulimit -n 20; compare … --jobs 2`` ended in a 49-line "Too many open files" traceback, rc 1
LIMIT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def _limit_reached(exc: OSError) -> str:
    """What a limit of open files that was reached means, and what to do (no file blamed)."""
    if exc.errno == errno.ENFILE:
        return (
            "this machine's table of open files is full (ENFILE): close other programs, or "
            "raise the system's limit (sysctl fs.file-max), then run the command again; "
            "nothing already written is lost"
        )
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = "" if soft == resource.RLIM_INFINITY else f" ({soft})"
    return (
        f"too many open files: this process reached its limit of open files{limit}; raise it "
        "(ulimit -n 4096) and run the command again; nothing already written is lost"
    )


def is_file_error(exc: OSError) -> bool:
    """A file-system failure (reported as one line), not a network or other OS failure."""
    return (
        isinstance(exc, _FILE_ERRORS)
        or exc.filename is not None
        or exc.errno in _FULL_ERRNOS
        or exc.errno in _IO_ERRNOS
        or exc.errno in LIMIT_ERRNOS
    )


# ---------------------------------------------------------------------------------------------
# argument types: each error names the valid range; argparse prefixes the flag.


def _number(text: str, kind: Callable[[str], float | int]) -> float | int:
    if not text.isascii():  # int() and float() read "٣" or "３" as 3: refuse, as TOML does
        raise argparse.ArgumentTypeError(f"expected {kind.__name__} in ASCII digits, got {text!r}")
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def float_range(lo: float, hi: float, *, lo_open: bool, hi_open: bool) -> Callable[[str], float]:
    """Argparse type: a float in an interval, with the interval in the error message."""
    shown = interval(lo, hi, lo_open, hi_open)

    def parse(text: str) -> float:
        value = float(_number(text, float))
        ok_lo = value > lo if lo_open else value >= lo
        ok_hi = value < hi if hi_open else value <= hi
        if not (ok_lo and ok_hi):
            raise argparse.ArgumentTypeError(f"must be in {shown}, got {text}")
        return value

    parse.__name__ = "float"
    return parse


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """Argparse type: an integer in ``[lo, hi]``."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {text}")
        return value

    parse.__name__ = "int"
    return parse


def int_at_least(lo: int) -> Callable[[str], int]:
    """Argparse type: an integer ``>= lo``."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text}")
        return value

    parse.__name__ = "int"
    return parse


POSITIVE = float_range(0.0, math.inf, lo_open=True, hi_open=True)
MAX_SEED = 2**63 - 1
#: ``--seed``: what a preset's ``seed`` may hold (TOML's int64), 0 to 2**63 - 1; a 4,001-digit
#: ``--seed`` was stored as given (tenth review of issue 15, finding 5)
SEED = int_in(0, MAX_SEED)
RATE = float_range(0.0, 1.0, lo_open=True, hi_open=False)
DELTA = float_range(0.0, 1.0, lo_open=True, hi_open=True)
#: ``--noise-multiplier``: at least ``privacy.events.MIN_NOISE_MULTIPLIER`` (1e-100; not imported,
#: to keep dp-accounting out of the parser), below which the accountants are not reliable.
NOISE_MULTIPLIER = float_range(1e-100, math.inf, lo_open=False, hi_open=True)
