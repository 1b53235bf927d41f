"""``python -m treecask``: the Python package's own commands.

The C++ ``treecask`` tool (docs/cli.md) inspects, verifies, imports and
exports archives; the commands here (import-orbax, import-flax, gc) need Python
libraries the C++ tool cannot use, and the ``treecask`` command that pip
installs runs them as well (treecask/_cli.py). Exit statuses are the C++ tool's (docs/cli.md "Exit codes"): 0 success,
1 usage error, 2 not found, 3 not an archive, 4 unsupported version,
5 corruption / checksum mismatch, 6 key not found, 7 invalid argument,
8 I/O error, 9 output exists, 10 unsupported (e.g. orbax-checkpoint missing),
11 internal error. Errors go to stderr as "treecask: <error>".
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import treecask._core as _core

from . import errors

# treecask.errors class -> exit status (src/cli/commands.h ExitStatus; ChecksumError is a CorruptionError).
_EXIT = {errors.NotFoundError: 2, errors.NotAnArchiveError: 3, errors.VersionError: 4, errors.CorruptionError: 5,
         errors.KeyNotFoundError: 6, errors.InvalidArgumentError: 7, errors.ShapeError: 7, errors.StructureError: 7,
         errors.IoError: 8, errors.AlreadyExistsError: 9, errors.UnsupportedError: 10}
EXIT_USAGE = 1
EXIT_INTERNAL = 11


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 1, as the C++ tool's do
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"treecask: usage: {message}\n")


def _key_value(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return tuple(text.split("=", 1))


def _parser(prog: str = "python -m treecask") -> argparse.ArgumentParser:
    p = _Parser(prog=prog,
                description="treecask commands that need Python libraries (docs/python.md).",
                epilog=__doc__.split("\n\n", 2)[1].replace("\n", " "))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    o = sub.add_parser(
        "import-orbax", help="convert an Orbax checkpoint directory into one archive",
        description=(
            "Convert an Orbax checkpoint into one treecask archive (treecask.import_orbax). "
            "SRC is a directory written by ocp.StandardCheckpointer / PyTreeCheckpointer, a "
            "CheckpointManager step directory (its PyTree items are found from "
            "_CHECKPOINT_METADATA: one item is written at the archive root, several as a dict "
            "keyed by item name) or a CheckpointManager root (the highest step). Every array is "
            "restored on the host with Orbax's own metadata (no target tree, no device needed); "
            "key paths, dtypes and values are kept, and a NamedSharding's mesh axes and "
            "PartitionSpec become the leaf's sharding info. Needs orbax-checkpoint."),
        epilog=("Prints 'wrote DST from CHECKPOINT [step N] items NAMES: <n> leaves (<k> sharded), "
                "<raw> raw bytes, <stored> stored bytes, <file> file bytes' (sizes in bytes). "
                "Exit status: 0 ok; 1 usage; 2 SRC, item or step missing; 7 SRC not an Orbax "
                "checkpoint; 9 DST exists (no --overwrite); 10 orbax-checkpoint not installed or "
                "a non-PyTree item."))
    o.add_argument("src", metavar="SRC", help="Orbax checkpoint directory")
    o.add_argument("dst", metavar="DST", help="archive file to write")
    o.add_argument("--item", help="import only this CheckpointManager item (default: all PyTree items)")
    o.add_argument("--step", type=int,
                   help="with a CheckpointManager root or a Flax checkpoint directory: this step (default: the highest)")
    _save_arguments(o)

    f = sub.add_parser(
        "import-flax", help="convert a legacy Flax checkpoint (msgpack or checkpoint_N) into one archive",
        description=(
            "Convert a legacy Flax checkpoint into one treecask archive (treecask.import_flax). "
            "SRC is a msgpack file written by flax.serialization.to_bytes or by "
            "flax.training.checkpoints.save_checkpoint (msgpack backend), an Orbax checkpoint_N "
            "directory of save_checkpoint (Orbax backend), or a save_checkpoint directory: its "
            "latest checkpoint_* (Flax's natural sort, as restore_checkpoint picks it) or "
            "--step N. msgpack is decoded by flax.serialization.msgpack_restore, Orbax by "
            "import-orbax, so the archive holds the state dict restore_checkpoint(SRC, None) "
            "returns. Needs flax (and orbax-checkpoint for the Orbax backend)."),
        epilog=("Prints 'wrote DST from CHECKPOINT [step N] (BACKEND): <n> leaves (<k> sharded), "
                "<raw> raw bytes, <stored> stored bytes, <file> file bytes' (sizes in bytes). "
                "Exit status: 0 ok; 1 usage; 2 SRC or the step missing, or no checkpoint_* in "
                "SRC; 7 not Flax msgpack, or --step with a file; 9 DST exists (no --overwrite); "
                "10 flax not installed, a multi-process (_gda) array or a bytes leaf."))
    f.add_argument("src", metavar="SRC", help="Flax checkpoint file or directory")
    f.add_argument("dst", metavar="DST", help="archive file to write")
    f.add_argument("--step", type=_step, help="with a checkpoint directory: this step (default: the latest)")
    f.add_argument("--prefix", default="checkpoint_",
                   help="checkpoint name prefix given to save_checkpoint (default: checkpoint_)")
    _save_arguments(f)

    g = sub.add_parser(
        "gc", help="remove what dead savers left under a bucket prefix nobody saves to any more",
        description=(
            "Remove what dead savers left under URL (s3://bucket/prefix, gs://, az://), a prefix "
            "nobody saves to any more (docs/stores.md \"Cleaning up after a killed saver\"): "
            "temporaries <name>.tmp.<host>.<pid>.<hex16> of any host, the shard objects of "
            "multi-process checkpoints that have no index.cask, and (S3 with botocore) incomplete "
            "multipart uploads; only those at least --older-than seconds old. A save still running "
            "under URL and older than that fails (it never commits half a checkpoint)."),
        epilog=("Prints one line per leftover, '<removed|would remove> <kind> <URL> (<age> s, <n> "
                "bytes)', then a total. Exit status: 0 ok; 1 usage; 2 no such bucket; 8 I/O error or "
                "access denied; 10 not an object store URL."))
    g.add_argument("url", metavar="URL", help="the prefix: s3://bucket/prefix (the whole bucket: s3://bucket)")
    g.add_argument("--older-than", type=float, default=3600.0, metavar="SECONDS",
                   help="only what is at least this old (default 3600)")
    g.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    return p


def command_help() -> List[tuple]:
    """(name, one-line help) of each command here, in order: what the pip
    ``treecask --help`` lists beside the C++ tool's subcommands (_cli.py)."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(c.dest, c.help) for c in sub._choices_actions]


def _step(text: str):
    from .interop.flax import parse_step

    if parse_step(text) is None:
        raise argparse.ArgumentTypeError(f"expected a step number, got {text!r}")
    return parse_step(text)


def _save_arguments(o: argparse.ArgumentParser) -> None:
    o.add_argument("--compression", choices=("auto", "none", "lz4"), default="auto",
                   help="auto: LZ4 where it saves >= 10%% (default); none: raw, zero-copy; lz4: always")
    o.add_argument("--chunk-size", type=int, default=None,
                   help="bytes per chunk, a multiple of 64 in [4096, 67108864] (default 1048576)")
    o.add_argument("--shuffle", action="store_true",
                   help="byte-shuffle LZ4-coded leaves of 2/4/8/16-byte dtypes (writes format 2.0)")
    o.add_argument("--metadata", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="add an archive metadata key-value (repeatable)")
    o.add_argument("--overwrite", action="store_true", help="replace DST if it exists")


def _import_orbax(a: argparse.Namespace) -> int:
    from .interop.orbax import import_orbax

    r = import_orbax(a.src, a.dst, item=a.item, step=a.step, **_save_options(a))
    names = ",".join(n or "(root)" for n, _ in r.items)
    skipped = f" (skipped non-PyTree items: {','.join(r.skipped)})" if r.skipped else ""
    return _wrote(a, r, f" items {names}{skipped}")


def _import_flax(a: argparse.Namespace) -> int:
    from .interop.flax import import_flax

    r = import_flax(a.src, a.dst, step=a.step, prefix=a.prefix, **_save_options(a))
    return _wrote(a, r, f" ({r.backend})")


def _save_options(a: argparse.Namespace) -> dict:
    return dict(metadata=dict(a.metadata), compression=a.compression, chunk_size=a.chunk_size, shuffle=a.shuffle,
                overwrite=a.overwrite)


def _wrote(a: argparse.Namespace, r, what: str) -> int:
    """Prints what an import wrote (the epilog's line); exit status 0."""
    step = f" step {r.step}" if r.step is not None else ""
    print(f"wrote {a.dst} from {r.checkpoint}{step}{what}: {r.num_leaves} leaves ({r.num_sharded} sharded), "
          f"{r.stats.raw_bytes} raw bytes, {r.stats.stored_bytes} stored bytes, {r.stats.file_bytes} file bytes")
    return 0


def _gc(a: argparse.Namespace) -> int:
    from . import stores
    from .stores import _gc

    if a.older_than < 0:
        raise errors.InvalidArgumentError(f"--older-than must be >= 0, got {a.older_than}")
    store, path = stores.resolve(a.url)
    found = _gc.collect(store, path, older_than=a.older_than, dry_run=a.dry_run)
    verb = "would remove" if a.dry_run else "removed"
    for f in found:
        print(f"{verb} {f.kind} {store.display(f.path)} ({f.age_s:.0f} s, {f.size} bytes)")
    print(f"{verb} {len(found)} leftovers, {sum(f.size for f in found)} bytes, under {store.display(path)}")
    return 0


def main(argv: Optional[List[str]] = None, prog: str = "python -m treecask") -> int:
    """Runs one command; returns its exit status (see the module docstring).

    ``argv``: the arguments after the program name (default ``sys.argv[1:]``);
    ``prog``: the program name usage messages show (the ``treecask`` entry
    point, treecask/_cli.py, passes ``"treecask"``)."""
    a = _parser(prog).parse_args(argv)
    try:
        return {"import-orbax": _import_orbax, "import-flax": _import_flax, "gc": _gc}[a.command](a)
    except errors.Error as e:
        print(f"treecask: {e}", file=sys.stderr)
        return next((status for cls, status in _EXIT.items() if isinstance(e, cls)), EXIT_INTERNAL)
    except Exception as e:  # noqa: BLE001 -- a bug, or a library's own error: one line, never a traceback
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"treecask: internal error: {type(e).__name__}: {_core.redact_urls_in(first)}",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
