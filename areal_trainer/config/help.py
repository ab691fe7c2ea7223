"""``--help``: every configuration key with its type, default and description, from the key index
(``keys.py``, read from the schema, so the help cannot drift from it). The defaults are the schema's; the
presets in ``conf/`` set some keys otherwise.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import sys
import textwrap
from importlib import resources

from .compat import IGNORED, REF_READ, REJECTED
from .keys import Key, lookup, schema, suggest_key
from .overrides import CONFIG_GROUPS

PROG = "python -m areal_trainer"
HEADER = (f"Configuration keys by section, with their schema defaults (a preset sets some keys otherwise: "
          f"`{PROG} --config-name grpo --cfg job` prints the composed values).")
FOOTER = "Defaults are the schema's; a preset may set other values (`--config-name PRESET --cfg job` prints them)."
# A period ends a sentence unless it ends "e.g.", "i.e." or "..."; the overview shows first sentences only.
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\.\.)\.\s+(?=[A-Z0-9`(])")


class UnknownKeyError(LookupError):
    """``--help`` was asked about a key that does not exist; the message names the closest one."""


# -- rendering -----------------------------------------------------------------------------------------

def _paragraphs(doc: str) -> list[str]:
    """Paragraphs with the source's line breaks undone, RST literals (double backticks) in single ones."""
    return [" ".join(p.split()).replace("``", "`") for p in doc.split("\n\n") if p.strip()]


def first_sentence(doc: str) -> str:
    paras = _paragraphs(doc)
    if not paras:
        return ""
    end = _SENTENCE_END.search(paras[0])
    return paras[0][: end.start() + 1] if end else paras[0]


def _wrap(text: str, indent: int, width: int) -> list[str]:
    pad = " " * indent  # import paths and names like seq-mean-token-sum-norm stay whole
    return textwrap.wrap(text, width, initial_indent=pad, subsequent_indent=pad, break_long_words=False,
                         break_on_hyphens=False)


def _doc_lines(doc: str, indent: int, width: int, full: bool, empty: str = "(no description)") -> list[str]:
    paras = _paragraphs(doc) if full else [first_sentence(doc)] if doc.strip() else []
    return [line for p in paras or ([empty] if empty else []) for line in _wrap(p, indent, width)]


def _notes(dotted: str) -> list[str]:
    """What ``config/compat.py`` says about a key that is rejected or ignored here."""
    def hit(pattern: str) -> bool:
        return fnmatch.fnmatch(dotted, pattern) or dotted.startswith(pattern + ".")

    notes = [f"Only some values work here: {why}." for p, why in REJECTED.items() if hit(p)]
    notes += [f"Has no effect here: {why}." for p, why in IGNORED.items() if hit(p)]
    if dotted.startswith("ref.") and dotted.split(".")[1] not in REF_READ:
        notes.append("Not read: the reference policy reads only ref.path and ref.dtype.")
    return notes


def _value_lines(key: Key, indent: int, width: int, full: bool) -> list[str]:
    lines = [f"{' ' * indent}{key.dotted}: {key.kind} = {key.value}", *_doc_lines(key.doc, indent + 4, width, full)]
    return lines + [line for n in (_notes(key.dotted) if full else []) for line in _wrap(n, indent + 4, width)]


def _section_lines(key: Key, width: int, full: bool) -> list[str]:
    null = key.dotted and key.default is None
    lines = [(key.dotted or "Top-level keys") + (" (null by default)" if null else "")]
    lines += _doc_lines(key.doc, 2, width, full, empty="")
    if null and full:
        lines += _wrap(f"A command-line override of one of its keys (e.g. `{key.children[0].dotted}=...`) fills "
                       "it with the defaults below.", 2, width)
    if key.same_as and not full:
        return lines + _wrap(f"Same keys and defaults as `{key.same_as}`: `{PROG} --help {key.dotted}` lists "
                             "them.", 2, width)
    values = [c for c in key.children if c.section is None]
    if full and values and len(lines) > 1:  # in the full text, the description stands apart from the keys
        lines.append("")
    lines += [line for c in values for line in _value_lines(c, 2, width, full)]
    return lines + [line for c in key.children if c.section is not None
                    for line in ["", *_section_lines(c, width, full)]]


def _choices(group: str = "") -> list[str]:
    """The YAML files (without ``.yaml``) of ``conf/``, the presets, or of one of its config groups."""
    try:
        root = resources.files("areal_trainer.conf")
        return sorted(p.name[:-5] for p in (root / group if group else root).iterdir() if p.name.endswith(".yaml"))
    except (ModuleNotFoundError, OSError):  # an install without conf/ still gets the key help
        return []


def usage(width: int = 100) -> str:
    presets = ", ".join(n for n in _choices() if n != "config")
    items = [
        ("--config-name PRESET", f"the default task with that algorithm: {presets} (default: config, GRPO)"),
        ("algo=NAME", "the same algorithm presets as a config group (conf/algo/), e.g. in sweeps"),
        ("KEY=VALUE", "set a key, e.g. actor.eps_clip=0.3 (+KEY=VALUE and ++KEY=VALUE work too)"),
        ("-m KEY=A,B ...", "a sweep, one job per combination: -m algo=grpo,rloo seed=1,2"),
        ("--cfg job [--resolve]", "print the composed configuration instead of training"),
        ("--help KEY", "one key, or a whole section, with its full description"),
        ("--hydra-help", "Hydra's own help"),
    ]
    lines = ["Usage", f"  {PROG} [--config-name PRESET] [algo=NAME] [KEY=VALUE ...]"]
    for flag, what in items:
        wrapped = _wrap(what, 28, width)
        lines += [f"    {flag:<23} {wrapped[0].lstrip()}", *wrapped[1:]]
    return "\n".join(lines)


def overview(width: int = 100) -> str:
    """The help of ``--help``: every key with the first sentence of its description, then the usage."""
    return "\n".join([*_wrap(HEADER, 0, width), "", *_section_lines(schema(), width, False), "", usage(width)])


# -- one key ---------------------------------------------------------------------------------------------

def key_help(dotted: str, width: int = 100) -> str:
    """The full help of one key, or of a section and everything in it; raises ``UnknownKeyError``."""
    dotted = dotted.lstrip("+")
    if dotted in CONFIG_GROUPS:
        return "\n".join(_wrap(f"{dotted}: a config group (conf/{dotted}/), chosen with {dotted}=NAME (+{dotted}=NAME "
                               "when the config selects none); NAME is one of: "
                               f"{', '.join(_choices(dotted))}.", 0, width))
    if dotted.split(".")[0] == "hydra":
        return f"{dotted}: one of Hydra's own settings; see `{PROG} --hydra-help`."
    key = lookup(dotted) if dotted else None
    if key is not None and key.dotted != dotted:  # inside a free-form dict value
        return "\n".join([*_value_lines(key, 0, width, True),
                          f"    {dotted} lies inside it: its keys are free-form, passed on as given."])
    if key is None:
        raise UnknownKeyError(f"{dotted!r} is not a configuration key.{suggest_key(dotted)} "
                              f"`{PROG} --help` lists every key.")
    lines = _section_lines(key, width, True) if key.section is not None else _value_lines(key, 0, width, True)
    return "\n".join([*lines, "", *_wrap(FOOTER, 0, width)])


# -- the command line ------------------------------------------------------------------------------------

def help_request(argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``argv`` asks for help (``--help``, ``-h``, ``--help KEY``, ``--help=KEY``), and about which key."""
    for i, arg in enumerate(argv):
        if arg.startswith("--help="):
            return True, arg.split("=", 1)[1] or None
        if arg in ("--help", "-h"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return True, nxt if nxt and not nxt.startswith("-") and "=" not in nxt else None
    return False, None


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns))


def _emit(text: str, stream) -> None:
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:  # `--help | head`: the reader left; silence the error Python reports at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def handle_help(argv: list[str]) -> int | None:
    """Print the help that ``argv`` asks for and return the exit status; None when it asks for none."""
    asked, dotted = help_request(argv)
    if not asked:
        return None
    try:
        text = key_help(dotted, _width()) if dotted else overview(_width())
    except UnknownKeyError as e:
        _emit(f"Error: {e}", sys.stderr)
        return 2
    _emit(text, sys.stdout)
    return 0
