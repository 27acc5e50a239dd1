"""GGUF files (llama.cpp's single-file models) as ordinary model folders.

A GGUF file holds the weights (often quantized), the tokenizer, the chat template and the architecture's
settings. transformers reads one with `from_pretrained(folder, gguf_file=NAME)` (the `gguf` package parses it)
and dequantizes the weights to float32, which takes seconds; it then refuses `save_pretrained` on that model.
`import_gguf` therefore builds a plain model from the file's config (without the quantization entry), loads
the dequantized state dict into it and writes an ordinary folder: config.json, model.safetensors, the
tokenizer files and chat_template.jinja, plus `memagent-import.json` (the source file's name and sha256, and the size
and sha256 of every file written).
Every command loads that folder in a second or two.

`resolve_model(name)` is what the loaders call: a GGUF file given as `--model` is converted once into a cache
folder keyed by the file's sha256 (`MEMAGENT_CACHE`, default ~/.cache/memagent) and that folder is returned, once
its files match the sizes and hashes recorded (a damaged entry is converted again); a model folder has its
safetensors files checked against their headers (cut short: one error); anything else is returned unchanged. A
full disk while converting is one error naming the folder, nothing left there. The file is checked first by its header (`read_header`: the magic
bytes, the version, the architecture), so a truncated, corrupt or unsupported file is one clear error before
the slow part.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import IO, Any, Callable

from memagent.backends.base import BackendError
from memagent.io import file_sha256, os_error_message

MAGIC = b"GGUF"
IMPORT_RECORD = "memagent-import.json"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_KEY_BYTES = 1 << 16  # a key is a dotted name; a larger length field means a damaged file
MAX_STRING_BYTES = 1 << 26  # a chat template is kilobytes; 64 MB bounds what one field may claim
MAX_ARRAY_ITEMS = 1 << 24  # the largest vocabularies have a few hundred thousand tokens
MAX_ARRAY_DEPTH = 8  # arrays of arrays: merges and vocabularies are one level; deeper is a damaged file


class GGUFError(BackendError):
    """A GGUF file that cannot be used: not GGUF, damaged, or of an architecture transformers cannot load."""


def is_gguf(path: str | Path) -> bool:
    """True when `path` is a file that starts with the GGUF magic bytes (the name does not matter)."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with p.open("rb") as fh:
            return fh.read(4) == MAGIC
    except OSError:
        return False


def _read(fh: IO[bytes], n: int, path: Path) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise GGUFError(f"{path} is truncated: its header ends early (a partial download?); fetch the file again")
    return data


def _string(fh: IO[bytes], path: Path, limit: int) -> bytes:
    (n,) = struct.unpack("<Q", _read(fh, 8, path))
    if n > limit:
        raise GGUFError(f"{path} is damaged: a header field claims {n:,} bytes; fetch the file again")
    return _read(fh, n, path)


def _value(fh: IO[bytes], kind: int, path: Path, keep: bool, depth: int = 0) -> Any:
    """One header value of type `kind`; arrays are skipped (returned as None) unless `keep`. Arrays of arrays
    deeper than `MAX_ARRAY_DEPTH` are refused (200,000 deep was a RecursionError)."""
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(fh, struct.calcsize(fmt), path))[0]
    if kind == _STRING:
        return _string(fh, path, MAX_STRING_BYTES).decode("utf-8", errors="replace")
    if kind == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"{path} is damaged: its header nests arrays more than {MAX_ARRAY_DEPTH} deep; fetch the "
                            "file again")
        item_kind, count = struct.unpack("<IQ", _read(fh, 12, path))
        if count > MAX_ARRAY_ITEMS:
            raise GGUFError(f"{path} is damaged: an array claims {count:,} items; fetch the file again")
        if item_kind in _SCALARS and not keep:  # skip fixed-size items in one seek
            fh.seek(count * struct.calcsize(_SCALARS[item_kind]), os.SEEK_CUR)
            return None
        if not keep:
            for _ in range(count):
                _value(fh, item_kind, path, keep, depth + 1)
            return None
        return [_value(fh, item_kind, path, keep, depth + 1) for _ in range(count)]
    raise GGUFError(f"{path} is damaged: unknown value type {kind} in its header; fetch the file again")


def _alignment(fields: dict[str, Any], path: Path) -> int:
    """`general.alignment` (32 when absent): a positive power of two held as an integer, else a GGUFError (0 was a
    ZeroDivisionError, 0.5 or a string a traceback)."""
    value = fields.get("general.alignment", 32)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise GGUFError(f"{path} is damaged: its general.alignment is {value!r}"[:300] + ", not a positive power of "
                        "two; fetch the file again")
    return value


def read_header(path: str | Path) -> dict[str, Any]:
    """The scalar and string fields of a GGUF file's header ({key: value}; arrays left out), plus
    `GGUF.version`, `GGUF.tensor_count` and the file's size, checked against the tensors' declared extent."""
    p = Path(path)
    with p.open("rb") as fh:
        if fh.read(4) != MAGIC:
            raise GGUFError(f"{p} is not a GGUF file (it does not start with the bytes 'GGUF')")
        version, tensors, kvs = struct.unpack("<IQQ", _read(fh, 20, p))
        if version not in (2, 3):
            raise GGUFError(f"{p} is GGUF version {version}; this reader knows versions 2 and 3")
        fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": tensors}
        for _ in range(kvs):
            key = _string(fh, p, MAX_KEY_BYTES).decode("utf-8", errors="replace")
            (kind,) = struct.unpack("<I", _read(fh, 4, p))
            value = _value(fh, kind, p, keep=False)
            if value is not None:
                fields[key] = value
        fields["GGUF.data_end"] = _tensor_extent(fh, p, tensors, _alignment(fields, p))
    size = p.stat().st_size
    if size < fields["GGUF.data_end"]:
        raise GGUFError(f"{p} is truncated: its tensors need {fields['GGUF.data_end']:,} bytes but the file has "
                        f"{size:,} (a partial download?); fetch the file again")
    return fields


def _tensor_extent(fh: IO[bytes], path: Path, count: int, alignment: int) -> int:
    """Where the last tensor's data ends: the tensor infos give each offset, shape and type."""
    try:
        from gguf.constants import GGML_QUANT_SIZES  # lazy: gguf
    except ImportError:
        raise _missing_gguf() from None
    end = 0
    for _ in range(count):
        _string(fh, path, MAX_KEY_BYTES)
        (n_dims,) = struct.unpack("<I", _read(fh, 4, path))
        if n_dims > 8:
            raise GGUFError(f"{path} is damaged: a tensor claims {n_dims} dimensions; fetch the file again")
        dims = struct.unpack(f"<{n_dims}Q", _read(fh, 8 * n_dims, path))
        kind, offset = struct.unpack("<IQ", _read(fh, 12, path))
        from gguf.constants import GGMLQuantizationType  # lazy: gguf

        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise GGUFError(f"{path} has a tensor of unknown type {kind}; fetch the file again") from None
        elements = 1
        for d in dims:
            elements *= d
        end = max(end, offset + elements // block * type_size)
    start = fh.tell()
    start += (-start) % alignment
    return start + end


def _missing_gguf() -> GGUFError:
    return GGUFError("reading a GGUF file needs the `gguf` package: pip install 'memagent[gguf]' "
                     "(or pip install gguf)")


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers converts (its `GGUF_CONFIG_MAPPING`, less the non-model entries)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # lazy: transformers

    return sorted(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))


def check_gguf(path: str | Path) -> dict[str, Any]:
    """The header of a GGUF file that transformers can load, or a GGUFError that says why not."""
    try:
        import gguf  # noqa: F401  # lazy: gguf
    except ImportError:
        raise _missing_gguf() from None
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p} is not a file")
    header = read_header(p)
    arch = header.get("general.architecture")
    supported = supported_architectures()
    if arch not in supported:
        raise GGUFError(f"{p} holds a model of architecture {arch!r}, which transformers cannot load from GGUF; "
                        f"supported: {', '.join(supported)}")
    return header


def import_gguf(path: str | Path, out: str | Path, *, progress: Callable[[str], None] | None = None,
                sha256: str | None = None, remedy: str = "choose another --out") -> Path:
    """Convert the GGUF file `path` into the model folder `out` (which must not exist); returns `out`.

    Written into a temporary folder beside `out` and renamed at the end, so a failure leaves nothing; a disk that
    fills up (or another write error) is one GGUFError naming `out` (`remedy`: what else to do)."""
    src, dest = Path(path), Path(out)
    header = check_gguf(src)
    say = progress or (lambda _msg: None)
    sha = sha256 or file_sha256(src)
    tmp = dest.parent / f".{dest.name}.importing-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        say(f"converting {src.name} ({header['general.architecture']}, {src.stat().st_size / 2**20:.0f} MiB) "
            "to a model folder (dequantized to float32)")
        _convert(src, tmp)
        record = {"source": src.name, "sha256": sha, "architecture": header["general.architecture"],
                  "name": header.get("general.name"), "context_length": _context_length(header),
                  "files": folder_files(tmp)}  # what `entry_damage` checks a cache entry against
        (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, dest)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        failed = _write_failure(e)
        if failed is not None:
            raise GGUFError(f"cannot write the converted model to {dest}: {failed}; free some space or {remedy} "
                            "(nothing was left there)") from None
        raise
    return dest


def _write_failure(e: BaseException) -> str | None:
    """What went wrong when a write failed (a full disk: safetensors reports it as its own error, "os error 28"),
    or None when `e` is no write failure."""
    try:
        from safetensors import SafetensorError  # lazy: safetensors (with transformers)
    except ImportError:  # pragma: no cover
        SafetensorError = OSError  # noqa: N806
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "no space left on the device" if e.errno == errno.ENOSPC else os_error_message(e) or str(e)
    if isinstance(e, SafetensorError):
        text = str(e)
        full = "os error 28" in text or "StorageFull" in text or "No space left" in text
        return "no space left on the device" if full else f"the weights could not be written ({text[:200]})"
    if isinstance(e, OSError):
        return os_error_message(e)
    return None


def folder_files(folder: Path) -> dict[str, dict[str, Any]]:
    """{name: {bytes, sha256}} of the files of `folder` (not its import record): what a cache entry must hold."""
    return {f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
            for f in sorted(folder.iterdir()) if f.is_file() and f.name not in (IMPORT_RECORD, VERIFIED)}


def entry_damage(folder: Path) -> str | None:
    """Why the cache entry `folder` cannot be used (a file missing, of another size or hash than its import record
    says, the record unreadable; an entry from before the record listed its files: no config.json or a damaged
    safetensors file), or None when it is whole. The hashes are checked again only when a file's size or mtime
    changed since they last matched (`VERIFIED`), so a load does not re-read the weights each time."""
    try:
        record = json.loads((folder / IMPORT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"its {IMPORT_RECORD} cannot be read"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files:
        if not (folder / "config.json").is_file():
            return "it has no config.json"
        return safetensors_damage(folder)
    stamps = {}  # name -> [bytes, mtime_ns] of each file as it was when its hash was last found right
    for name, want in files.items():
        f = folder / name
        want = want if isinstance(want, dict) else {}
        if not f.is_file():
            return f"{name} is missing"
        st = f.stat()
        if st.st_size != want.get("bytes"):
            return f"{name} has {st.st_size:,} bytes, {want.get('bytes')!r} recorded"
        stamps[name] = [st.st_size, st.st_mtime_ns]
    if _read_stamps(folder) == stamps:  # no file written since its hash was checked: not hashed again
        return None
    for name, want in files.items():
        if file_sha256(folder / name) != want.get("sha256"):
            return f"{name} does not hold the bytes recorded (its sha256 differs)"
    try:
        (folder / VERIFIED).write_text(json.dumps(stamps), encoding="utf-8")
    except OSError:  # a read-only cache: hashed again next time
        pass
    return None


VERIFIED = ".memagent-verified.json"  # a cache entry's files as they were when their hashes last matched


def _read_stamps(folder: Path) -> Any:
    try:
        return json.loads((folder / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


MAX_SAFETENSORS_HEADER = 100 << 20  # the safetensors format's own bound on its JSON header


def safetensors_damage(folder: Path) -> str | None:
    """Why a `*.safetensors` file of `folder` cannot be loaded whole (cut short, a header that is not the format's),
    from its header alone (8 bytes of length, the JSON of every tensor's offsets); None when all look whole."""
    for f in sorted(folder.glob("*.safetensors")):
        size = f.stat().st_size
        with f.open("rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                return f"{f.name} is cut short or damaged ({size:,} bytes, not even its header)"
            try:
                header = json.loads(fh.read(n))
                end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                return f"{f.name} is damaged (its header is not a safetensors header)"
        if 8 + n + end > size:
            return f"{f.name} is cut short: its tensors need {8 + n + end:,} bytes, the file has {size:,}"
    return None


def _context_length(header: dict[str, Any]) -> int | None:
    return header.get(f"{header.get('general.architecture')}.context_length")


def _load_gguf(src: Path) -> tuple[Any, Any]:
    """(tokenizer, model) of the GGUF file through transformers (the `gguf` package parses it), dequantized to
    float32; any failure there is a damaged or odd file."""
    import torch  # lazy: torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers

    folder, name = str(src.parent), src.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - any failure inside the converter is a damaged or odd file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GGUFError(f"cannot convert {src}: {first}") from None
    return tokenizer, loaded


def _convert(src: Path, out: Path) -> None:
    """transformers' GGUF loading, then a plain model of the same config takes the weights and is saved."""
    import torch  # lazy: torch
    from transformers import AutoConfig, AutoModelForCausalLM  # lazy: transformers

    tokenizer, loaded = _load_gguf(src)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "transformers_version")})
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise GGUFError(f"cannot convert {src}: the weights do not match its config (missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]})")
    model.generation_config = loaded.generation_config
    tokenizer.model_max_length = config.max_position_embeddings  # the file's context length, not "unbounded"
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def cache_root() -> Path:
    """Where `resolve_model` keeps converted GGUF files: $MEMAGENT_CACHE or ~/.cache/memagent."""
    env = os.environ.get("MEMAGENT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "memagent"


def cached_import(path: str | Path, root: str | Path | None = None,
                  progress: Callable[[str], None] | None = None) -> Path:
    """The model folder of the GGUF file `path` in the cache (converted on the first call, keyed by sha256)."""
    sha = file_sha256(path)
    dest = Path(root or cache_root()) / "gguf" / sha[:24]
    say = progress or _stderr
    if (dest / IMPORT_RECORD).is_file():
        damage = entry_damage(dest)  # the files' sizes and hashes against those recorded at conversion
        if damage is None:
            return dest
        say(f"the cache entry {dest} of {Path(path).name} is damaged ({damage}): converting the file again")
        shutil.rmtree(dest, ignore_errors=True)
        if dest.exists():
            raise GGUFError(f"the cache entry {dest} of {Path(path).name} is damaged ({damage}) and cannot be "
                            "removed; remove that folder (or set MEMAGENT_CACHE to another folder)")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GGUFError(f"cannot make the cache folder {dest.parent} for the converted model: "
                        f"{_write_failure(e) or e}; set MEMAGENT_CACHE to a folder you can write") from None
    check_gguf(path)  # before the progress line: a bad file is one error, nothing said of converting it
    say(f"{Path(path).name} is a GGUF file: converting it once into {dest} (memagent model import does the same "
        "into a folder you name)")
    try:
        return import_gguf(path, dest, progress=say, sha256=sha,
                           remedy="set MEMAGENT_CACHE to a folder on a disk with room (the cache of converted models)")
    except OSError:
        if (dest / IMPORT_RECORD).is_file():  # another process converted it at the same time
            return dest
        raise


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_model(name: Any, weights: bool = True) -> Any:
    """What a loader should open for `name`: the cached folder of a GGUF file, else `name` itself.

    A folder that holds a GGUF file but no config.json is refused with the way out: transformers would
    otherwise fail on the missing config with a message about the Hub. With `weights` (a loader of the model,
    not of its tokenizer alone), a model folder whose safetensors file is cut short is one BackendError (it was
    safetensors' traceback)."""
    if not isinstance(name, (str, Path)):
        return name
    p = Path(name)
    if p.is_file() and is_gguf(p):
        return str(cached_import(p))
    if weights and p.is_dir() and (p / "config.json").is_file():
        damage = safetensors_damage(p)
        if damage is not None:
            raise BackendError(f"model {p}: {damage} (a partial copy or download?); copy or download the model "
                               "again")
    if p.is_dir() and not (p / "config.json").exists():
        ggufs = sorted(f.name for f in p.glob("*.gguf"))
        if ggufs:
            raise GGUFError(f"{p} holds {', '.join(ggufs[:3])} but no config.json: name the GGUF file itself "
                            f"(--model {p / ggufs[0]}), or convert it once with "
                            f"`memagent model import {p / ggufs[0]} --out MODEL_DIR`")
    return name
