"""The files a command writes beside its redirections: what the programs toolkeeper knows write through their
options and operands (`sort -o FILE`, `curl -o FILE`, `cp ... DEST`, `tee FILE`, `dd of=FILE`, `tar -x` into
the folder it runs in). `writes_under:` tests these and the redirections' targets.

A program not listed here writes only what its redirections name, as far as `writes_under:` can tell; a rule
that names a program tests every path it names with `under:`. A word known only at run time (a variable) among
a listed program's words may be a file it writes: unknown, which a deny or ask rule counts as a match.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkeeper.policy.commands import Command
from toolkeeper.policy.flags import has_flags


@dataclass(frozen=True)
class Writer:
    """What one program writes (or, with `mode`, what it writes when one of those short flags is given)."""

    options: frozenset[str] = frozenset()  # options whose value is a file or folder it writes: -o --output
    valued: frozenset[str] = frozenset()  # its other options that take a value (an operand is told from them)
    operands: str = ""  # "all": every operand; "last": the last of two or more (a destination); "": none
    here: bool = False  # it writes into the folder it runs in (tar -x, unzip, wget): `.`, moved by cd and -C
    keys: tuple[str, ...] = ()  # `key=FILE` operands (dd's of=) and settings (below) it writes, as _setting reads
    settings: frozenset[str] = frozenset()  # options whose value is a `key=value` setting (wget -e output_document=)
    opaque: frozenset[str] = frozenset()  # options naming a file of more options (curl -K): it may write anything
    anywhere: bool = False  # it writes where its input says (tar -P, cpio -i): anything
    mode: tuple[str, ...] = ()  # only with one of these short flags (long names as flags.py reads them)
    unless: tuple[str, ...] = ()  # not with one of these (gzip -c writes to its output)


def _writer(options: str = "", valued: str = "", **fields: object) -> Writer:
    for name in ("settings", "opaque"):
        fields[name] = frozenset(str(fields.get(name, "")).split())
    return Writer(frozenset(options.split()), frozenset(valued.split()), **fields)  # type: ignore[arg-type]


_COPY = _writer("-t --target-directory", "-S --suffix -m --mode -o --owner -g --group --backup --reflink "
                "--sparse --preserve --no-preserve", operands="last")
_EVERY = _writer(operands="all")
_COMPILER = _writer("-o -MF", "-I -L -l -D -U -x -MT -MQ -include -isystem -iquote")
_PACKER = _writer("-o --output", "-S --suffix -b -T --threads -L --level", operands="all", unless=("c", "t", "l"))
WRITERS: dict[str, tuple[Writer, ...]] = {
    "cp": (_COPY,), "ln": (_COPY,), "link": (_COPY,), "mv": (_writer("-t --target-directory", "-S --suffix",
                                                                     operands="all"),),
    "install": (_writer("-t --target-directory", "-S --suffix -m --mode -o --owner -g --group", operands="all"),),
    "tee": (_EVERY,), "sponge": (_EVERY,), "dd": (_writer(keys=("of",)),),
    "touch": (_writer(valued="-r --reference -d --date -t", operands="all"),),
    "truncate": (_writer(valued="-s --size -r --reference", operands="all"),),
    "mkdir": (_writer(valued="-m --mode", operands="all"),), "mkfifo": (_writer(valued="-m --mode", operands="all"),),
    "rm": (_EVERY,), "rmdir": (_EVERY,), "unlink": (_EVERY,), "shred": (_writer(valued="-n -s", operands="all"),),
    "sort": (_writer("-o --output -T --temporary-directory", "-k --key -t --field-separator -S --buffer-size "
                     "--parallel --files0-from --batch-size --compress-program --random-source"),),
    "shuf": (_writer("-o --output", "-n --head-count -i --input-range --random-source"),),
    "uniq": (_writer(valued="-f --skip-fields -s --skip-chars -w --check-chars", operands="last"),),
    "xxd": (_writer(valued="-c -g -l -o -s -n", operands="last"),),
    "sed": (_writer(valued="-e --expression -f --file -l --line-length", operands="all", mode=("i",)),),
    "curl": (_writer("-o --output --output-dir -c --cookie-jar -D --dump-header --trace --trace-ascii --stderr "
                     "--libcurl --etag-save --hsts --alt-svc", opaque="-K --config"), _writer(here=True, mode=("O",))),
    "wget": (_writer("-O --output-document -P --directory-prefix -o --output-file -a --append-output "
                     "--save-cookies", here=True, opaque="--config", settings="-e --execute",
                     keys=("outputdocument", "dirprefix", "logfile", "savecookies")),),
    "aria2c": (_writer("-d --dir -o --out -l --log", here=True, opaque="--conf-path -i --input-file"),),
    "tar": (_writer(here=True, mode=("x",)), _writer("-f --file", mode=("c", "r", "u")),
            _writer(anywhere=True, mode=("P",))),
    "unzip": (_writer("-d", here=True), _writer(anywhere=True, mode=(":",))),
    "7z": (_writer("-o", here=True),), "7za": (_writer("-o", here=True),),
    "cpio": (_writer("-D --directory -F --file -O", "-H --format -E --pattern-file -I", operands="all", here=True,
                     mode=("i", "o", "p")), _writer(anywhere=True, mode=("i",))),
    **{name: (_PACKER,) for name in ("gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "lzma", "unlzma", "zstd",
                                     "unzstd", "lz4", "brotli")},
    "split": (_writer(valued="-a --suffix-length -b --bytes -C --line-bytes -l --lines -n --number "
                      "--additional-suffix --filter", operands="last"),),
    "csplit": (_writer("-f --prefix", "-b --suffix-format -n --digits"),),
    "rsync": (_writer("--log-file --backup-dir --temp-dir -T --partial-dir --write-batch --only-write-batch",
                      "-e --rsh --rsync-path --exclude --include --filter -f --files-from --exclude-from "
                      "--include-from --chmod --chown --port --password-file --suffix --compare-dest --copy-dest "
                      "--link-dest --max-size --min-size --timeout --bwlimit -B --block-size --out-format -M "
                      "--remote-option --usermap --groupmap", operands="last"),),
    "scp": (_writer(valued="-P -i -o -F -c -l -S -J -D -X", operands="last"),),
    "patch": (_writer("-o --output -d --directory -B --prefix -r --reject-file", "-p --strip -i --input -F "
                      "--fuzz -D --ifdef -V --version-control -z --suffix -Y --basename-prefix", operands="all",
                      here=True),),
    "iconv": (_writer("-o --output", "-f --from-code -t --to-code"),), "gpg": (_writer("-o --output"),),
    "base64": (_writer("-o --output"),), "openssl": (_writer("-out"),), "ssh-keygen": (_writer("-f"),),
    "mktemp": (_writer("-p --tmpdir", operands="all"),), "visudo": (_writer("-f --file"),),
    "find": (_writer("-fprint -fprint0 -fprintf -fls"),), "pip": (_writer("-t --target --prefix --root"),),
    "pip3": (_writer("-t --target --prefix --root"),), "sudoedit": (_EVERY,), "sudo": (_writer("-e --edit"),),
    **{name: (_COMPILER,) for name in ("cc", "gcc", "g++", "c++", "clang", "clang++", "ld", "rustc", "go")},
    **{name: (_writer(valued="-c -S -u -i -T --cmd", operands="all"),)
       for name in ("vi", "vim", "nvim", "nano", "emacs", "ex", "ed")},
}


def is_writer(command: Command) -> bool:
    return command.program in WRITERS


def written_by(command: Command) -> list[str | None]:
    """The files and folders the command writes through its options and operands (None: one known at run time);
    `.` for the folder it runs in."""
    found: list[str | None] = []
    words = list(command.argv[1:])
    for writer in WRITERS.get(command.program or "", ()):
        if not _applies(command, writer):
            continue
        found += _option_values(words, writer)
        if writer.anywhere or (writer.opaque and _option_values(words, Writer(options=writer.opaque))):
            found.append(None)  # what it writes is said elsewhere: anything
        settings = [*_option_values(words, Writer(options=writer.settings)), *words] if writer.keys else []
        found += [value for key, value in map(_setting, settings) if key in writer.keys]
        operands = _operands(words, writer)
        if writer.operands == "all":
            found += operands
        elif writer.operands == "last" and len(operands) > 1:
            found.append(operands[-1])
        if writer.here:
            found.append(".")
    return found


def _applies(command: Command, writer: Writer) -> bool:
    """Whether the writer's mode is (or may be) on: one of its flags given, and none of those it is off with."""
    if writer.mode and all(has_flags(command, (flag,)) is False for flag in writer.mode):
        return False
    return not any(has_flags(command, (flag,)) is True for flag in writer.unless)


def _setting(word: str | None) -> tuple[str, str | None]:
    """A `key=value` word as (key, value), the key as wget and dd compare it (`output_document`, `of`). A word
    known only at run time is among the option values already (unknown)."""
    key, equals, value = (word or "").partition("=")
    return (key.strip().lower().replace("_", "").replace("-", ""), value.strip()) if equals else ("", None)


def _option_values(words: list[str | None], writer: Writer) -> list[str | None]:
    """The values of these options: `-o FILE`, `-oFILE`, `-xo FILE` (a cluster of short flags), `--output=FILE`,
    `--output FILE`, `--out FILE` (GNU's start of a long option), `-out FILE` (openssl's); a word known only at
    run time may be one (None)."""
    found: list[str | None] = []
    options = writer.options
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) else None
        if word is None:
            found.append(None)
        elif word in options:
            found.append(following)
        elif word.startswith("--") and "=" in word and _long(word.partition("=")[0], options):
            found.append(word.partition("=")[2])
        elif word.startswith("--") and _long(word, options):
            found.append(following)
        elif word.startswith("-") and not word.startswith("--") and len(word) > 2:
            found += _in_cluster(word, following, writer)
    return found


def _long(given: str, options: frozenset[str]) -> bool:
    return len(given) > 3 and any(option.startswith(given) for option in options if option.startswith("--"))


def _in_cluster(word: str, following: str | None, writer: Writer) -> list[str | None]:
    """`-xzf FILE`, `-oFILE`: the value of a short option of the writer's in a cluster of short flags, which
    ends at the first that takes a value (the rest of the word, or the next word)."""
    for position, letter in enumerate(word[1:], start=2):
        if "-" + letter in writer.options:
            return [word[position:] or following]
        if "-" + letter in writer.valued:
            return []
    return []


def _operands(words: list[str | None], writer: Writer) -> list[str | None]:
    """The words that are not options nor their values (a word known only at run time may be either: None)."""
    operands: list[str | None] = []
    skip, ended = False, False
    for word in words:
        if skip:
            skip = False
        elif word is None or ended or word == "-" or not word.startswith("-"):
            operands.append(word)
        elif word == "--":
            ended = True
        else:
            skip = _takes_next(word, writer.valued | writer.options)
    return operands


def _takes_next(word: str, valued: frozenset[str]) -> bool:
    """Whether the option word takes the next word as its value: `-o`, `--output`, `-xzf` (its last letter)."""
    if word.startswith("--"):
        return "=" not in word and (word in valued or _long(word, valued))
    if word in valued:
        return True
    letters = word[1:]
    first = next((index for index, letter in enumerate(letters) if "-" + letter in valued), None)
    return first == len(letters) - 1
