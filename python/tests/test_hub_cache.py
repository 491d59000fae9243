"""Issue 38: a Hugging Face hub cache, read in place by the core. The layout is written with huggingface_hub's own
functions (there is no network to the Hub here: blobs, refs and snapshots are filed the way its downloads file them,
and its scan_cache_dir and try_to_load_from_cache must accept them): ``models--org--name/blobs/<sha256>``,
``refs/main`` holding the revision, ``snapshots/<revision>/<file>`` a relative link ``../../blobs/<sha256>``. The
snapshot, one of its files and the repository (at refs/main) open; every other link is refused, naming the file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import distckpt

huggingface_hub = pytest.importorskip("huggingface_hub")
file_download = pytest.importorskip("huggingface_hub.file_download")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

REPO_ID = "org/tiny-model"
REVISION = "5d0f0e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29"


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(38)
    return {
        "embed.weight": rng.standard_normal((8, 4)).astype(np.float32),
        "layers.0.w": rng.standard_normal((4, 4)).astype(np.float16),
        "layers.1.w": rng.integers(-9, 9, (4, 6)).astype(np.int64),
    }


def _download(cache: Path, files: dict[str, bytes], revision: str = REVISION) -> tuple[Path, Path]:
    """Files `files` into `cache` as huggingface_hub's hf_hub_download does: the blob under its sha256 (an LFS file's
    etag), the pointer a relative link made by huggingface_hub's _create_symlink, refs/main by its own function."""
    repo = cache / file_download.repo_folder_name(repo_id=REPO_ID, repo_type="model")
    snapshot = repo / "snapshots" / revision
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        file_download._create_symlink(str(blob), str(pointer), new_blob=False)
    file_download._cache_commit_hash_for_specific_revision(str(repo), "main", revision)
    return repo, snapshot


def _sharded_files(tensors: dict[str, np.ndarray]) -> dict[str, bytes]:
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    files = {f: safetensors_numpy.save({n: tensors[n] for n in ns}) for f, ns in shards.items()}
    weight_map = {n: f for f, ns in shards.items() for n in ns}
    import json

    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "tiny"}'
    return files


@pytest.fixture
def cache(tmp_path):
    tensors = _tensors()
    repo, snapshot = _download(tmp_path / "hub", _sharded_files(tensors))
    return tmp_path / "hub", repo, snapshot, tensors


def test_huggingface_hub_accepts_the_layout(cache):
    root, repo, snapshot, _ = cache
    info = huggingface_hub.scan_cache_dir(root)
    assert not info.warnings, info.warnings
    (scanned,) = info.repos
    assert scanned.repo_id == REPO_ID and scanned.repo_type == "model"
    (revision,) = scanned.revisions
    assert revision.commit_hash == REVISION and revision.refs == frozenset({"main"})
    assert {f.file_name for f in revision.files} == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "config.json"}  # fmt: skip
    got = huggingface_hub.try_to_load_from_cache(REPO_ID, "model.safetensors.index.json", cache_dir=root)
    assert Path(got) == snapshot / "model.safetensors.index.json"
    assert os.readlink(snapshot / "config.json").startswith("../../blobs/")


@pytest.mark.parametrize("which", ["snapshot", "repository", "index file", "one shard"])
def test_the_cache_reads_in_place(cache, which):
    root, repo, snapshot, tensors = cache
    path = {
        "snapshot": snapshot,
        "repository": repo,
        "index file": snapshot / "model.safetensors.index.json",
        "one shard": snapshot / "model-00002-of-00002.safetensors",
    }[which]
    want = tensors if which != "one shard" else {"layers.1.w": tensors["layers.1.w"]}
    with distckpt.open(path) as r:
        assert r.metadata.format == "safetensors" and r.metadata.source_version is None
        assert set(r) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(r.read(name), value, err_msg=name)
        np.testing.assert_array_equal(r.map_all()[sorted(want)[-1]], want[sorted(want)[-1]])
    out = distckpt.load({name: np.zeros_like(v) for name, v in want.items()}, path)
    for name, value in want.items():
        np.testing.assert_array_equal(out[name], value)


def _relink(snapshot: Path, name: str, target: str) -> None:
    os.unlink(snapshot / name)
    os.symlink(target, snapshot / name)


SHARD = "model-00001-of-00002.safetensors"


@pytest.mark.parametrize(
    "hostile, says",
    [
        ("outside the repository", r"does not lead to a file in its hub cache repository's blobs directory"),
        ("/etc/passwd", r"'/etc/passwd', which does not lead to a file"),
        ("a directory", r"is a directory, not a regular file"),
        ("a chain of links", r"never a chain of links"),
        ("a blob that is a link", r"never a chain of links"),
        (".. games", r"does not lead to a file"),
    ],
)
def test_links_out_of_the_blobs_are_refused(cache, tmp_path, hostile, says):
    root, repo, snapshot, tensors = cache
    blob = os.path.basename(os.readlink(snapshot / SHARD))
    if hostile == "outside the repository":
        (tmp_path / "outside.safetensors").write_bytes((repo / "blobs" / blob).read_bytes())
        _relink(snapshot, SHARD, "../../../../outside.safetensors")
    elif hostile == "/etc/passwd":
        _relink(snapshot, SHARD, "/etc/passwd")
    elif hostile == "a directory":
        (repo / "blobs" / "adir").mkdir()
        _relink(snapshot, SHARD, "../../blobs/adir")
    elif hostile == "a chain of links":
        os.symlink(f"../../blobs/{blob}", snapshot / "hop")
        _relink(snapshot, SHARD, "hop")
        says = r"is a symbolic link to 'hop', which does not lead to a file"
    elif hostile == "a blob that is a link":
        os.symlink("/etc/passwd", repo / "blobs" / "alias")
        _relink(snapshot, SHARD, "../../blobs/alias")
    else:
        _relink(snapshot, SHARD, f"../../blobs/../../{repo.name}/blobs/{blob}")
    for path in (snapshot, repo):
        with pytest.raises(distckpt.CorruptCheckpointError, match=f"{SHARD}.*{says}"):
            distckpt.open(path)


@pytest.mark.parametrize("ref", ["../x", "..", "a/b", "", "/etc"])
def test_a_hostile_refs_main_is_refused(cache, ref):
    root, repo, snapshot, tensors = cache
    (repo / "refs" / "main").write_text(ref)
    with pytest.raises(distckpt.CorruptCheckpointError, match=r"refs/main' holds .*not a revision name"):
        distckpt.open(repo)
    # The snapshot itself still opens.
    with distckpt.open(snapshot) as r:
        assert set(r) == set(tensors)


def test_a_repository_without_refs_main_names_its_revisions(cache):
    root, repo, snapshot, tensors = cache
    (repo / "refs" / "main").unlink()
    with pytest.raises(distckpt.NotFoundError, match=f"has no refs/main.*'{REVISION}'"):
        distckpt.open(repo)


@pytest.mark.parametrize("which", ["repository", "snapshot"])
def test_three_ranks_load_row_shards_of_the_cache(cache, tmp_path, which):
    """A collective open: rank 0 describes the checkpoint; every rank finds the cache's blobs through its own
    directory (and, for the repository, its own refs/main)."""
    import _foreign_workers
    import _workers

    root, repo, snapshot, tensors = cache
    path = repo if which == "repository" else snapshot
    np.savez(tmp_path / "expected.npz", **tensors)
    _workers.spawn(
        _workers.run,
        3,
        lambda rank, results: (
            _foreign_workers.hub_load_rank,
            rank,
            (3, f"file://{tmp_path}/rdv", str(path), str(tmp_path / "expected.npz"), "always"),
            results,
        ),
        180,
    )
