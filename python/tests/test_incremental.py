"""Incremental saves (``save(..., base=...)``, FORMAT.md 4.1) through the Python package and the real core: only what
changed is written, every read follows the references, resharded over real Gloo ranks, and a base that is gone or
replaced is refused naming both checkpoints."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import _workers
import distckpt

DEADLINE = 180


def run_ranks(fn, world, *args):
    _workers.spawn(_workers.run, world, lambda rank, results: (fn, rank, (world, *args), results), DEADLINE)


def model(step: int) -> dict:
    rng = np.random.default_rng(7)
    return {
        "frozen": {"emb": rng.standard_normal((256, 512)).astype(np.float32), "norm": np.ones(512, np.float32)},
        "adapter": np.full((64, 512), step, np.float32),
        "step": step,
    }


def test_an_incremental_save_writes_only_what_changed_and_loads_exactly(tmp_path):
    full = distckpt.save(model(1), tmp_path / "step-1")
    assert full.bytes_reused == 0
    incr = distckpt.save(model(2), tmp_path / "step-2", base=tmp_path / "step-1")
    frozen_bytes = 256 * 512 * 4 + 512 * 4
    assert incr.bytes_reused == frozen_bytes
    assert incr.bytes_written == 64 * 512 * 4 + len(b"2")  # the adapter and "step" (a JSON bytes entry)
    assert incr.total_bytes == full.total_bytes
    with distckpt.open(tmp_path / "step-2") as r:
        assert r.metadata.bases == ("step-1",)
        assert r.metadata.chain_length == 1
        assert r.metadata.bytes_in_bases == frozen_bytes
        assert r.metadata.format_version == (2, 0)
        r.verify()
    with distckpt.open(tmp_path / "step-1") as r:
        assert r.metadata.bases == () and r.metadata.format_version[0] == 1
    got = distckpt.load(None, tmp_path / "step-2")
    want = model(2)
    np.testing.assert_array_equal(got["frozen"]["emb"], want["frozen"]["emb"])
    np.testing.assert_array_equal(got["adapter"], want["adapter"])
    assert got["step"] == 2
    # Region reads of a referenced tensor.
    with distckpt.open(tmp_path / "step-2") as r:
        np.testing.assert_array_equal(r["frozen.emb"][10:20, 100:110], want["frozen"]["emb"][10:20, 100:110])


def test_chains_are_bounded_by_full_every_and_async_saves_take_a_base(tmp_path):
    distckpt.save(model(1), tmp_path / "s1")
    for step in (2, 3, 4):
        s = distckpt.save(model(step), tmp_path / f"s{step}", base=f"s{step - 1}", full_every=3)
        with distckpt.open(tmp_path / f"s{step}") as r:
            assert r.metadata.chain_length == {2: 1, 3: 2, 4: 0}[step]
        assert (s.bytes_reused == 0) == (step == 4)
    handle = distckpt.async_save(model(5), tmp_path / "s5", base=tmp_path / "s4")
    assert handle.result(timeout=60).bytes_reused > 0
    np.testing.assert_array_equal(distckpt.load(None, tmp_path / "s5")["adapter"], model(5)["adapter"])


def test_a_removed_or_replaced_base_is_refused_naming_both(tmp_path):
    distckpt.save(model(1), tmp_path / "a")
    distckpt.save(model(2), tmp_path / "b", base=tmp_path / "a")
    other = model(9)
    other["frozen"]["emb"] += 1
    with pytest.raises(distckpt.Error, match=r"overwriting checkpoint .* would break 1 incremental .*'b'"):
        distckpt.save(other, tmp_path / "a", overwrite=True)
    with pytest.raises(distckpt.Error, match="would break"):
        distckpt.remove_checkpoint(tmp_path / "a")
    shutil.move(tmp_path / "a", tmp_path / "a-moved")  # replaced behind the library's back
    distckpt.save(other, tmp_path / "a")
    with pytest.raises(distckpt.CorruptCheckpointError, match=r"refers to base checkpoint 'a'.*metadata changed"):
        distckpt.load(None, tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "a-moved")
    with pytest.raises(distckpt.CorruptCheckpointError, match=r"refers to base checkpoint 'a'.*cannot be read"):
        distckpt.load(None, tmp_path / "b")


def test_a_base_must_be_a_sibling(tmp_path):
    (tmp_path / "x").mkdir()
    distckpt.save(model(1), tmp_path / "x" / "a")
    with pytest.raises(distckpt.InvalidArgumentError, match="must be a sibling"):
        distckpt.save(model(2), tmp_path / "b", base=tmp_path / "x" / "a")
    with pytest.raises(distckpt.NotFoundError, match="does not exist"):
        distckpt.save(model(2), tmp_path / "x" / "b", base="missing")
    assert not (tmp_path / "b").exists() and not (tmp_path / "x" / "b").exists()


def test_three_ranks_save_incrementally_two_ranks_load_it_resharded(tmp_path):
    full, incr = str(tmp_path / "full"), str(tmp_path / "incr")
    run_ranks(_workers.incremental_save_rank, 3, f"file://{tmp_path}/rdv1", full, incr)
    run_ranks(_workers.incremental_load_rank, 2, f"file://{tmp_path}/rdv2", incr)
    with distckpt.open(incr) as r:
        assert r.metadata.bases == ("full",)
        assert r.metadata.num_files == 3 + 3  # the three ranks' new files and the three of the base they refer to


def test_flatten_makes_a_self_contained_copy_and_lets_the_base_go(tmp_path):
    distckpt.save(model(1), tmp_path / "a")
    distckpt.save(model(2), tmp_path / "b", base=tmp_path / "a")
    info = distckpt.flatten(tmp_path / "b", tmp_path / "c")
    assert info["bytes_from_bases"] == 256 * 512 * 4 + 512 * 4 and info["bytes_copied"] > info["bytes_from_bases"]
    distckpt.flatten(tmp_path / "b", tmp_path / "b", overwrite=True)  # in place
    with distckpt.open(tmp_path / "b") as r:
        assert r.metadata.bases == () and r.metadata.format_version[0] == 1
    distckpt.remove_checkpoint(tmp_path / "a")
    for name in ("b", "c"):
        got = distckpt.load(None, tmp_path / name)
        np.testing.assert_array_equal(got["frozen"]["emb"], model(2)["frozen"]["emb"])
        np.testing.assert_array_equal(got["adapter"], model(2)["adapter"])


def test_mapped_views_export_and_consolidate_follow_the_references(tmp_path):
    import safetensors.numpy

    distckpt.save(model(1), tmp_path / "a")
    distckpt.save(model(2), tmp_path / "b", base="a")
    want = model(2)
    with distckpt.open(tmp_path / "b") as r:
        mapped = r.map_all()
        np.testing.assert_array_equal(mapped.get_tensor("frozen.emb"), want["frozen"]["emb"])
        np.testing.assert_array_equal(mapped.get_tensor("adapter"), want["adapter"])
    files = distckpt.export_safetensors(tmp_path / "b", tmp_path / "hf")
    got = {}
    for f in files:
        if f.endswith(".safetensors"):
            got.update(safetensors.numpy.load_file(str(tmp_path / "hf" / f)))
    np.testing.assert_array_equal(got["frozen.emb"], want["frozen"]["emb"])
    np.testing.assert_array_equal(got["adapter"], want["adapter"])
    from distckpt.consolidate import consolidate

    consolidate(tmp_path / "b", tmp_path / "one.safetensors")
    one = safetensors.numpy.load_file(str(tmp_path / "one.safetensors"))
    np.testing.assert_array_equal(one["frozen.norm"], want["frozen"]["norm"])
