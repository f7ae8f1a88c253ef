"""A model by its name on the Hugging Face Hub: `hf:ORG/NAME[@REVISION][:FILE|:QUANT]` -> a local
path in huggingface_hub's own cache, the one the ecosystem shares (HF_HOME, HF_HUB_CACHE,
HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE mean what they mean to every other tool).

    hf:HuggingFaceTB/SmolLM2-135M-Instruct            the checkpoint directory (config.json, safetensors, tokenizer)
    hf:ORG/NAME-GGUF:Q4_K_M                           the one *.gguf file whose name holds that quant
    hf:ORG/NAME-GGUF:model-q8_0.gguf                  that file
    hf:ORG/NAME@v1.0  hf:ORG/NAME@<commit>:Q4_0       a branch, tag or commit (default main)

Offline (HF_HUB_OFFLINE=1), or when the hub cannot be reached, what the cache holds for that
revision is used and the network never is. Everything after this module sees a plain path."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ColibriError
from .gguf import is_gguf

PREFIX = "hf:"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REFERENCE = re.compile(rf"hf:(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[^:@\s]+))?(?::(?P<select>[^:@\s/]+))?")
_QUANT = re.compile(r"[A-Za-z0-9_]+")
# The files of a checkpoint directory that the model stage reads (weights, configuration,
# tokenizer, chat template); nothing else of a repository is fetched.
_DIRECTORY_FILES = re.compile(r"[^/]+\.(json|safetensors|jinja)")


@dataclass(frozen=True)
class HubReference:
    """A parsed `hf:` model value; str() gives it back as written."""

    repo: str
    revision: str = "main"
    select: str | None = None  # a .gguf file name, or a quant name (Q4_K_M) to find one by

    def __str__(self) -> str:
        revision = "" if self.revision == "main" else f"@{self.revision}"
        return f"{PREFIX}{self.repo}{revision}{'' if self.select is None else ':' + self.select}"


def is_hub_reference(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_hub_reference(text: str) -> HubReference:
    """`hf:ORG/NAME[@REVISION][:FILE.gguf|:QUANT]`; ColibriError for anything else after hf:."""
    match = _REFERENCE.fullmatch(text)
    select = match and match["select"]
    if not match or (select and not is_gguf(select) and not _QUANT.fullmatch(select)):
        raise ColibriError(
            f"{text!r} is not a model on the hub: write hf:ORG/NAME, hf:ORG/NAME:QUANT (a GGUF file by "
            f"its quant, e.g. :Q4_K_M), hf:ORG/NAME:FILE.gguf, with @REVISION after the name for a "
            f"branch, tag or commit"
        )
    return HubReference(match["repo"], match["revision"] or "main", select)


def fetch(ref: HubReference, show_progress: bool) -> Path:
    """The local path of `ref` (a checkpoint directory or a .gguf file), downloaded into the
    cache unless it is there already. One-line ColibriErrors for a gated, private or missing
    repository, revision or file, and for a hub that cannot be reached with nothing cached."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    # huggingface_hub's own progress bars, on a terminal only (never with --json).
    if show_progress and sys.stderr.isatty():
        enable_progress_bars()
    else:
        disable_progress_bars()
    if constants.HF_HUB_OFFLINE:
        return _from_cache(ref, "HF_HUB_OFFLINE is set")
    try:
        info = huggingface_hub.HfApi().model_info(ref.repo, revision=ref.revision)
    except Exception as e:  # noqa: BLE001 - sorted into one-line messages below
        unreachable = _unreachable(e)
        if unreachable is None:
            raise _hub_error(ref, e) from None
        return _from_cache(ref, f"the hub cannot be reached ({unreachable})")
    files = [s.rfilename for s in info.siblings or []]
    wanted = _choose(ref, files)
    try:
        paths = [huggingface_hub.hf_hub_download(ref.repo, name, revision=info.sha or ref.revision) for name in wanted]
    except Exception as e:  # noqa: BLE001
        unreachable = _unreachable(e)
        raise (
            _hub_error(ref, e)
            if unreachable is None
            else ColibriError(f"{ref}: the download broke off ({unreachable}); run the command again to resume it")
        ) from None
    if info.sha and ref.revision != info.sha:
        # The files were fetched by commit, so the cache learns which commit the name stands for
        # (offline runs find it there).
        _remember_revision(ref, info.sha)
    snapshot = Path(paths[0]).parents[wanted[0].count("/")]
    return _local_path(snapshot, wanted)


def _local_path(snapshot: Path, wanted: list[str]) -> Path:
    """The GGUF file, or the checkpoint directory (the snapshot folder)."""
    return snapshot / wanted[0] if is_gguf(wanted[0]) else snapshot


def model_name(path: Path) -> str:
    """The name a model directory goes by: its own, or for a snapshot in the hub's cache
    (models--ORG--NAME/snapshots/COMMIT) the repository's NAME, not the commit."""
    path = path.resolve()
    store = path.parent.parent.name
    if path.parent.name == "snapshots" and store.startswith("models--") and store.count("--") >= 2:
        return store.split("--", 2)[2]
    return path.name


def _choose(ref: HubReference, files: list[str]) -> list[str]:
    """The repository files `ref` names: its one GGUF file by name or quant, or a checkpoint
    directory's files (or its only GGUF file when it has no config.json)."""
    ggufs = sorted(f for f in files if is_gguf(f))
    listed = ", ".join(ggufs) if ggufs else "none"
    if ref.select is not None and is_gguf(ref.select):
        if ref.select not in files:
            raise ColibriError(f"{ref}: the repository has no file {ref.select} (its GGUF files: {listed})")
        return [ref.select]
    if ref.select is not None:
        quant = re.compile(rf"(?<![A-Za-z0-9]){re.escape(ref.select)}(?![A-Za-z0-9_])", re.IGNORECASE)
        found = [f for f in ggufs if quant.search(f.rsplit("/", 1)[-1])]
        if len(found) != 1:
            how = "no GGUF file" if not found else f"{len(found)} GGUF files"
            raise ColibriError(
                f"{ref}: {how} with {ref.select} in its name (its GGUF files: {listed}); name one with :FILE.gguf"
            )
        return found
    if "config.json" in files:
        return sorted(f for f in files if _DIRECTORY_FILES.fullmatch(f))
    if len(ggufs) == 1:
        return ggufs
    if ggufs:
        raise ColibriError(f"{ref}: several GGUF files ({listed}): choose one with :QUANT or :FILE.gguf")
    raise ColibriError(f"{ref}: neither a checkpoint (no config.json) nor a GGUF file; its files: {', '.join(files)}")


def _from_cache(ref: HubReference, why: str) -> Path:
    """What the cache holds for `ref` (its revision's snapshot), without the network."""
    from huggingface_hub import constants

    storage = Path(constants.HF_HUB_CACHE) / f"models--{ref.repo.replace('/', '--')}"
    commit = ref.revision
    ref_file = storage / "refs" / ref.revision
    if ref_file.is_file():
        commit = ref_file.read_text(encoding="utf-8").strip()
    snapshot = storage / "snapshots" / commit
    files = (
        sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()) if snapshot.is_dir() else []
    )
    if not files:
        raise ColibriError(f"{ref}: {why}, and the cache ({constants.HF_HUB_CACHE}) does not hold this revision")
    return _local_path(snapshot, _choose(ref, files))


def _remember_revision(ref: HubReference, commit: str) -> None:
    from huggingface_hub import constants

    refs = Path(constants.HF_HUB_CACHE) / f"models--{ref.repo.replace('/', '--')}" / "refs" / ref.revision
    try:
        refs.parent.mkdir(parents=True, exist_ok=True)
        if not refs.is_file() or refs.read_text(encoding="utf-8") != commit:
            refs.write_text(commit, encoding="utf-8")
    except OSError as e:
        raise ColibriError(f"{ref}: cannot write the hub cache at {refs.parent}: {e.strerror}") from None


def _unreachable(error: Exception) -> str | None:
    """Why the hub could not be reached (a connection refused, a timeout, nothing cached to fall
    back on), or None for an answer the hub gave."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(error, HfHubHTTPError) or not isinstance(
        error, (httpx2.TransportError, OfflineModeIsEnabled, OSError)
    ):
        return None
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _hub_error(ref: HubReference, error: Exception) -> ColibriError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = constants.ENDPOINT
    if isinstance(error, GatedRepoError):
        return ColibriError(
            f"{ref}: the repository is gated: accept its terms on {where}/{ref.repo} and log in "
            f"(hf auth login, or set HF_TOKEN)"
        )
    if isinstance(error, RevisionNotFoundError):
        return ColibriError(f"{ref}: the repository has no revision {ref.revision!r} on {where}")
    if isinstance(error, RepositoryNotFoundError):
        return ColibriError(
            f"{ref}: no such repository on {where} (or it is private: log in with hf auth login, or set HF_TOKEN)"
        )
    if isinstance(error, EntryNotFoundError):
        return ColibriError(f"{ref}: a file the repository lists is missing on {where}")
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "?"
        return ColibriError(f"{ref}: the hub at {where} answered HTTP {status}")
    return ColibriError(f"{ref}: the hub at {where} gave an answer huggingface_hub could not use ({error})")
