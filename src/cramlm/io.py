"""Small torch-free helpers shared by every stage: atomic file writes, packaged resources, the files
of installed Python and npm packages, and the "did you mean" hint of error messages.

Every file cramlm writes under its final name is written beside it first and renamed when complete
(:func:`atomic_write`; a folder: :func:`atomic_dir`), so a crash, even a SIGKILL in the middle of a
write, never leaves a broken file or folder under that name. Importing this module imports no torch (tests/test_architecture.py), so a
config, a record or a report is written without paying for it.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import pickle
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

PKG_SCHEME = "pkg://"  # pkg://<path>: a file or folder shipped in cramlm/resources
PYTHON_SCHEME = "python://"  # python://<package>[==<version>]/<path>: inside an installed Python package
NPM_SCHEME = "npm://"  # npm://<package>@<version>/<path>: inside an npm package installed under npm_prefix()


def remove_leftover(path: Path) -> int:
    """Remove a file or folder a stopped process left behind (a temporary of an atomic write);
    returns the bytes it held."""
    if path.is_dir() and not path.is_symlink():
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path)
        return size
    size = path.lstat().st_size
    path.unlink()
    return size


def atomic_path(path: Path, pid: int | str | None = None) -> Path:
    """The temporary name ``path`` is written under (hidden, per process: ``pid``, default this
    one's; "*" gives the glob of every process's) before the rename."""
    return path.with_name(f".{path.name}.tmp-{os.getpid() if pid is None else pid}")


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """``with atomic_write(path) as tmp:`` write ``tmp``; it becomes ``path`` when the block ends
    normally, and is removed when it raises."""
    path = Path(path)
    tmp = atomic_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | Path, tmp: str | Path | None = None, if_exists: str = "replace",
               aside: str | Path | None = None, durable: bool = False) -> Iterator[Path]:
    """``with atomic_dir(folder) as tmp:`` fill the empty folder ``tmp``; it becomes ``folder`` when
    the block ends normally, and is removed when it raises (also on Ctrl-C), so ``folder`` is never
    seen half-written. ``tmp``: the temporary folder (default ``.<name>.tmp-<pid>`` beside it; a
    leftover of a killed writer is cleared first). When ``folder`` already exists at the end:
    ``if_exists="keep"`` keeps it and drops ``tmp`` (another process finished first: its result
    stands); ``"replace"`` moves it to ``aside`` (default ``.<name>.old-<pid>``), renames ``tmp``
    into place, then deletes the old one, so a kill in between leaves a complete folder under one of
    the two names. ``durable``: fsync every file and then the parent, so the rename survives a
    power loss (checkpoints)."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else atomic_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        if durable:
            for f in tmp.iterdir():
                fsync(f)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        if if_exists == "keep":
            shutil.rmtree(tmp)
            return
        old = Path(aside) if aside is not None else path.with_name(f".{path.name}.old-{os.getpid()}")
        try:
            os.replace(path, old)  # a kill from here until it is deleted leaves it to restore
        except OSError as e:  # (a mount point cannot be moved: EBUSY)
            shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(e.errno, e.strerror, str(path)) from None
    try:
        os.replace(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.replace(old, path)  # the earlier folder back in its place
        if if_exists == "keep" and e.errno in (errno.ENOTEMPTY, errno.EEXIST) and path.is_dir():
            return  # another process finished first, between the check and the rename: its result stands
        raise OSError(e.errno, e.strerror, str(path)) from None
    if durable:
        fsync(path.parent)
    if old is not None:
        shutil.rmtree(old)


def is_disk_full(e: BaseException | None) -> bool:
    """ENOSPC / EDQUOT, also as torch's and safetensors' own errors, which wrap the OS error in text."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left" in text or "StorageFull" in text or "Disk quota exceeded" in text:
            return True
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)  # ("raise ... from None": not this error's cause)
    return False


def free_space(path: str | Path) -> str:
    """The free space on the disk that holds ``path`` (or its nearest existing parent), in words."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return f"{shutil.disk_usage(path).free / 1e6:,.1f} MB free on that disk"
    except OSError:
        return "the free space unknown"


@contextmanager
def on_full_disk(path: str | Path, message: str, error: type[Exception] = ValueError) -> Iterator[None]:
    """A full disk inside the block (an OSError, or a library's own error around one, which names no
    file) becomes one ``error`` of ``message``, its ``{free}`` the free space on ``path``'s disk."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise error(message.replace("{free}", free_space(path))) from None


def fsync(path: str | Path) -> None:
    """Flush a file or folder to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2, default: Any = None) -> None:
    """``obj`` as strict JSON: a NaN or infinite float is written as null (bare ``NaN`` is no JSON);
    ``default`` as json.dumps's (e.g. ``str`` for paths)."""
    write_text(path, json.dumps(finite_json(obj), indent=indent, allow_nan=False, default=default) + "\n")


def write_result(path: str | Path, obj: Any, table: str, default: Any = None) -> None:
    """A benchmark's result file: ``obj`` as JSON at ``path`` and its table as Markdown beside it
    (``path`` with ``.md``), the folder made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj, indent=1, default=default)
    write_text(path.with_suffix(".md"), table + "\n")


def finite_json(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> None:
    """``safetensors.save_file``, atomically and with the permissions of any new file (it creates
    0600 files; run folders and exports are meant to be shared like the rest: 0666 less the umask).
    safetensors (and torch) are imported only when called."""
    from safetensors.torch import save_file

    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        os.chmod(tmp, 0o666 & ~umask())


DIGESTS = "digests.json"  # in a checkpoint or run folder: {"algorithm": "blake2b", "files": {name: hex}}


def file_digest(path: str | Path) -> str:
    """blake2b of a file's bytes, hex (about 1 s for 500 MB)."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()


def write_digests(folder: Path, names: Iterable[str], known: dict[str, str] | None = None,
                  pending: dict[str, str] | None = None) -> None:
    """Record the digest of each named file of ``folder`` in ``folder/digests.json``, with those
    already recorded for other files; ``known``: {name: digest} computed elsewhere (by the process
    that wrote the file); ``pending``: {name: digest} of files about to replace those names
    (replace_digested), accepted beside the recorded ones until the next write settles them."""
    path = Path(folder) / DIGESTS
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"] if path.is_file() else {}
    except (OSError, ValueError, KeyError, TypeError):
        files = {}
    files.update(known or {})
    files.update({name: file_digest(Path(folder) / name) for name in names})
    write_json(path, {"algorithm": "blake2b", "files": files, **({"pending": pending} if pending else {})})


@contextmanager
def replace_digested(folder: Path, names: Iterable[str]) -> Iterator[dict[str, Path]]:
    """``with replace_digested(folder, names) as tmp:`` write each new file to ``tmp[name]``; then
    their digests are recorded as pending, each is renamed into place and the record is settled.
    A stop at any moment leaves the files all old or all new, each matching digests.json, or some
    of each, which digest_problem refuses (files of two saves are never used together). The
    temporary files are removed when the block raises (a killed writer's: by the next call)."""
    folder = Path(folder)
    names = list(names)
    for name in names:  # a killed writer's leftovers (the folder has one writer: its run lock), and the
        mine = atomic_path(folder / name, "*")  # temporaries of writers that write atomically to tmp[name] themselves
        for leftover in [*folder.glob(mine.name), *folder.glob(atomic_path(mine, "*").name)]:
            leftover.unlink(missing_ok=True)
    tmp = {name: atomic_path(folder / name) for name in names}
    try:
        yield tmp
        new = {name: file_digest(path) for name, path in tmp.items()}
        write_digests(folder, [], pending=new)
        for name, path in tmp.items():
            os.replace(path, folder / name)
        write_digests(folder, [], known=new)
    except BaseException:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        raise


def digest_record(folder: Path) -> dict[str, str] | None:
    """{file name: digest} of ``folder/digests.json``; None when it is missing or unreadable."""
    try:
        files = json.loads((Path(folder) / DIGESTS).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files if isinstance(files, dict) else None


def digest_problem(path: str | Path) -> str | None:
    """Whether ``path`` still has the digest its folder's digests.json recorded: None when it does
    or when the folder has no digests.json; otherwise what is wrong, in a few words. A digests.json
    without an entry for ``path`` is damage: cramlm records every file of the folders it digests.
    A replacement stopped half-way (replace_digested's ``pending``) counts when its files are all
    old or all new, not a mix of the two saves."""
    path = Path(path)
    record = path.parent / DIGESTS
    if not record.is_file():
        return None
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
        files, pending = recorded["files"], recorded.get("pending") or {}
        expected, new = files.get(path.name), pending.get(path.name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{DIGESTS} is unreadable"
    if not isinstance(expected, str) and not isinstance(new, str):
        return f"{DIGESTS} records no digest of {path.name} (removed or changed since it was written)"
    digest = file_digest(path)
    if digest not in (expected, new):
        return f"{path.name} does not match its digest in {DIGESTS} (changed or damaged since it was written)"
    if path.name in pending:  # the others of its save must stand where it does: all old, or all new
        state = {name: _save_state(path.parent / name, files.get(name), d, digest if name == path.name else None)
                 for name, d in pending.items()}
        if len(set(state.values()) - {"both"}) > 1:
            return (f"{path.name} and {', '.join(n for n in state if n != path.name)} are from two saves (one stopped "
                    "half-way): resume the run (--resume auto) to save its weights again")
    return None


def _save_state(path: Path, old: str | None, new: str, digest: str | None = None) -> str:
    """Which save ``path`` (its ``digest``, if known) is from: "old", "new", "both" (the two saves
    wrote the same bytes) or "other"."""
    try:
        digest = digest or file_digest(path)
    except OSError:
        return "other"
    return "both" if digest == new == old else "new" if digest == new else "old" if digest == old else "other"


class CheckpointFileError(ValueError):
    """A checkpoint or run file cannot be used; the message names the file and what is wrong."""


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise CheckpointFileError(f"{path}: not a readable safetensors file, truncated or damaged ({e})") from None


def load_error_reason(e: BaseException) -> str:
    """One short line for a failed torch/safetensors load (torch adds paragraphs of advice)."""
    text = str(e).strip()
    if isinstance(e, pickle.UnpicklingError):  # torch.load(weights_only=True) refused a non-data object
        detail = next((line.strip() for line in text.splitlines() if "nsupported" in line), type(e).__name__)
        return f"refused: it holds more than tensors and plain data, so cramlm did not write it ({detail})"
    first = (text.splitlines() or [""])[0].split(". ")[0]
    return f"{type(e).__name__}: {first}"


def umask() -> int:
    """The process umask."""
    try:  # Linux: read it, rather than set and restore it (which races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class MissingPackage(FileNotFoundError):
    """A python:// or npm:// path whose package, or the version it names, is not installed; the
    message names the package and the command that installs it (``install``)."""

    def __init__(self, message: str, install: str = ""):
        super().__init__(message)
        self.install = install


def npm_prefix() -> Path:
    """Where npm:// paths look for packages: ``$CRAMLM_NPM_PREFIX``, else ``npm/`` in the per-user
    cache (:func:`user_cache`); ``npm install --prefix <it> <package>@<version>`` puts a package in
    its ``node_modules/``."""
    if os.environ.get("CRAMLM_NPM_PREFIX"):
        return Path(os.environ["CRAMLM_NPM_PREFIX"]).expanduser()
    return user_cache() / "npm"


def installed_package_path(spec: str) -> Path:
    """The path a ``python://`` or ``npm://`` spec names inside an installed package (its inner
    part may be a glob, left for the caller to expand); any other spec as a plain path.

    ``python://<package>[==<version>]/<path>`` is found without importing the package (its own
    dependencies need not be installed), ``npm://<package>@<version>/<path>`` under
    ``npm_prefix()/node_modules``, where ``package.json`` must hold that version. Raises
    :class:`MissingPackage` naming the install command when the package or version is absent."""
    if spec.startswith(PYTHON_SCHEME):
        return _python_package_path(spec)
    if spec.startswith(NPM_SCHEME):
        return _npm_package_path(spec)
    return Path(spec).expanduser()


def _python_package_path(spec: str) -> Path:
    import importlib.metadata
    import importlib.util

    name, _, inner = spec[len(PYTHON_SCHEME) :].partition("/")
    package, _, version = name.partition("==")
    pip = f"pip install --no-deps {package}=={version}" if version else f"pip install {package}"
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise MissingPackage(f"{spec}: the Python package '{package}' is not installed ({pip})", pip)
    if version:
        try:
            have = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            have = "unknown"
        if have != version:
            raise MissingPackage(f"{spec}: the Python package '{package}' is version {have}, not {version} ({pip})", pip)
    return Path(list(found.submodule_search_locations)[0]) / inner


def _npm_package_path(spec: str) -> Path:
    rest = spec[len(NPM_SCHEME) :]
    scope = ""
    if rest.startswith("@"):  # @scope/name@version/path
        scope, _, rest = rest.partition("/")
        scope += "/"
    name, _, inner = rest.partition("/")
    package, _, version = name.partition("@")
    package = scope + package
    if not version:
        raise MissingPackage(f"{spec}: an npm:// path names the package's version (npm://{package}@<version>/...)")
    prefix = npm_prefix()
    npm = f"npm install --prefix {prefix} --ignore-scripts {package}@{version}"
    root = prefix / "node_modules" / package
    try:
        have = json.loads((root / "package.json").read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        raise MissingPackage(f"{spec}: the npm package '{package}' is not installed under {prefix} ({npm})", npm) from None
    if have != version:
        raise MissingPackage(f"{spec}: the npm package '{package}' under {prefix} is version {have}, not {version} ({npm})", npm)
    return root / inner


def package_path(spec: str) -> Path:
    """``pkg://<path>`` as the path of that shipped resource; any other string as a user path."""
    if spec.startswith(PKG_SCHEME):
        return Path(str(resources.files("cramlm") / "resources" / spec[len(PKG_SCHEME) :]))
    return Path(spec).expanduser()


# Hugging Face's names (TrainingArguments, run_glue.py, BERT configs) -> cramlm's, tried in order: the
# first whose first part is a key here is suggested (``eval.learning_rate`` -> ``eval.lr``,
# ``train.learning_rate`` -> ``train.optim.lr``); the spelling is too far apart for difflib.
HF_NAMES: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr", "optim.lr"),
    "num_train_epochs": ("epochs",),
    "num_epochs": ("epochs",),
    "per_device_train_batch_size": ("batch_size",),
    "train_batch_size": ("batch_size",),
    "per_device_eval_batch_size": ("eval_batch_size",),
    "eval_batch_size": ("eval_batch_size",),
    "weight_decay": ("weight_decay", "optim.weight_decay"),
    "warmup_ratio": ("warmup",),
    "warmup_steps": ("warmup",),
    "lr_scheduler_type": ("schedule",),
    "max_grad_norm": ("grad_clip",),
    "adam_beta1": ("betas", "optim.betas"),
    "adam_beta2": ("betas", "optim.betas"),
    "adam_epsilon": ("eps", "optim.eps"),
    "max_steps": ("budget.steps",),
    "max_length": ("max_seq_length",),
    "model_max_length": ("max_seq_length",),
    "max_train_samples": ("max_train_examples",),
    "max_eval_samples": ("max_dev_examples",),
    "classifier_dropout": ("dropout",),
    "hidden_dropout_prob": ("dropout",),
    "attention_probs_dropout_prob": ("attention_dropout",),
    "num_hidden_layers": ("num_layers",),
    "num_attention_heads": ("num_heads",),
    "max_position_embeddings": ("max_seq_length",),
    "seed": ("seed",),
}


def did_you_mean(word: Any, known: Iterable[str], prefix: str = "") -> str:
    """`` Did you mean '<prefix><closest>'?`` for an error message, or "" when nothing is close
    (Hugging Face's names for a key, HF_NAMES, first)."""
    known = list(known)
    alias = next((a for a in HF_NAMES.get(str(word), ()) if a.split(".")[0] in known), None)
    if alias is not None:
        return f" Did you mean '{prefix}{alias}'? ('{word}' is Hugging Face's name)"
    close = difflib.get_close_matches(str(word), known, n=1)
    return f" Did you mean '{prefix}{close[0]}'?" if close else ""


def user_cache() -> Path:
    """cramlm's per-user cache folder: ``$CRAMLM_CACHE``, else ``$XDG_CACHE_HOME/cramlm``, else
    ``~/.cache/cramlm`` (prepared data in ``data/``, the hardware probe in ``hardware.json``)."""
    if os.environ.get("CRAMLM_CACHE"):
        return Path(os.environ["CRAMLM_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cramlm"
