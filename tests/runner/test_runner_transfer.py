"""assay.runner.transfer: inputs packed by content hash and landed in a node's cache, without Ray.

The cluster test (test_runner_ray_cluster.py) runs the same code across nodes; these check the pieces a
cluster would hide: equal content gives an equal hash, a forged or swapped blob is refused, a landed task
names only the node's cache, and nothing of the submitter's paths travels.
"""

from __future__ import annotations

import io
import pickle
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from assay.runner import Task
from assay.runner.transfer import (
    TransferError,
    digest,
    landed,
    pack,
    pack_into,
    ship_all,
    unpack_cached,
    unpack_to,
)


def _folder(root: Path) -> Path:
    root.mkdir()
    (root / "entrypoint.py").write_text("print('hi')\n")
    (root / "entrypoint.py").chmod(0o755)
    (root / "sub").mkdir()
    (root / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 4)
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "linked.bin").symlink_to(root / "sub" / "weights.bin")
    return root


def test_equal_content_gives_an_equal_hash_wherever_it_lies(tmp_path: Path) -> None:
    first = _folder(tmp_path / "id-00000001")
    second = _folder(tmp_path / "elsewhere")
    assert digest(pack(first)) == digest(pack(second))  # names, times and owners are not in the blob
    (second / "sub" / "weights.bin").write_bytes(b"changed")
    assert digest(pack(first)) != digest(pack(second))


def test_a_blob_lands_once_in_the_cache_with_links_followed(tmp_path: Path) -> None:
    blob = pack(_folder(tmp_path / "model"))
    cache = tmp_path / "cache"
    entry = unpack_cached(blob, digest(blob), cache)
    assert entry.parent == cache / digest(blob)
    assert sorted(p.name for p in entry.iterdir()) == ["entrypoint.py", "linked.bin", "sub"]  # dangling gone
    assert (entry / "linked.bin").read_bytes() == (entry / "sub" / "weights.bin").read_bytes()
    assert not (entry / "linked.bin").is_symlink() and (entry / "entrypoint.py").stat().st_mode & 0o111
    assert unpack_cached(blob, digest(blob), cache) == entry
    assert [p.name for p in cache.iterdir()] == [digest(blob)]  # no partial folder left


def test_a_forged_or_swapped_blob_is_refused(tmp_path: Path) -> None:
    blob = pack(_folder(tmp_path / "model"))
    with pytest.raises(TransferError, match="does not match its hash"):
        unpack_cached(blob[:-1] + b"x", digest(blob), tmp_path / "cache")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    evil = buffer.getvalue()
    with pytest.raises(TransferError, match="not one packed entry"):
        unpack_cached(evil, digest(evil), tmp_path / "cache")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("entry"), io.BytesIO())
        link = tarfile.TarInfo("entry/ground_truth.csv")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    linked = buffer.getvalue()
    with pytest.raises(TransferError, match="refused"):
        unpack_cached(linked, digest(linked), tmp_path / "cache")
    assert not (tmp_path / "escape.txt").exists() and not list((tmp_path / "cache").iterdir())


def test_unpack_to_writes_the_entry_at_the_target(tmp_path: Path) -> None:
    source = _folder(tmp_path / "model")
    blob = pack(source)
    unpack_to(blob, digest(blob), tmp_path / "out" / "id-00000003")
    assert digest(pack(tmp_path / "out" / "id-00000003")) == digest(blob)
    with pytest.raises(TransferError):
        unpack_to(blob, "0" * 64, tmp_path / "out" / "id-00000004")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["id-00000003"]  # nothing half-written


def test_a_shipment_names_no_path_and_lands_on_the_node_cache(tmp_path: Path) -> None:
    detector = _folder(tmp_path / "submitted-detector")
    models = [tmp_path / "round" / f"id-{i:08d}.pt" for i in range(3)]
    models[0].parent.mkdir()
    for i, model in enumerate(models):
        model.write_bytes(b"weights of model %d" % i)
    tasks = [
        Task(f"m{i}", ["python"], stage={"detector": detector, "model.pt": model}, shared_stage={"detector"})
        for i, model in enumerate(models)
    ]
    spool = tmp_path / "spool"
    spool.mkdir()
    shipments, blobs = ship_all(tasks, spool)
    assert len(blobs) == 4 == len(list(spool.iterdir()))  # the detector once, each model once
    assert all(digest(file.read_bytes()) == h for h, file in blobs.items())
    sent = pickle.dumps(shipments)
    assert str(tmp_path).encode() not in sent and b"id-0000000" not in sent
    fetched: list[str] = []

    def fetch(expected: str) -> bytes:
        fetched.append(expected)
        return blobs[expected].read_bytes()

    cache = tmp_path / "node-cache"
    tasks_here = []
    for shipment in shipments:
        with landed(shipment, fetch, cache) as task:
            tasks_here.append(task)
    assert len(fetched) == 4  # the shared detector was fetched once for the three tasks
    for task, original in zip(tasks_here, tasks, strict=True):
        assert all(cache in Path(source).parents for source in task.stage.values())
        assert task.shared_stage == original.shared_stage and task.key == original.key
        assert Path(task.stage["model.pt"]).read_bytes() == Path(original.stage["model.pt"]).read_bytes()


def test_an_unchanged_source_is_not_packed_again(tmp_path: Path) -> None:
    detector = _folder(tmp_path / "detector")
    model = tmp_path / "model.pt"
    model.write_bytes(b"weights")
    known: dict = {}
    first, blobs = ship_all(
        [Task("a", ["python"], stage={"detector": detector, "model.pt": model})], tmp_path, known
    )
    assert len(blobs) == 2
    again, blobs = ship_all([Task("b", ["python"], stage={"detector": detector})], tmp_path, known)
    assert blobs == {} and again[0].stage["detector"] == first[0].stage["detector"]
    (detector / "sub" / "weights.bin").write_bytes(b"retrained, a new size")
    changed, blobs = ship_all([Task("c", ["python"], stage={"detector": detector})], tmp_path, known)
    assert list(blobs) == [changed[0].stage["detector"]] != [first[0].stage["detector"]]


def test_the_same_content_from_two_paths_is_one_blob_file(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    tasks = [Task(str(i), ["python"], stage={"detector": _folder(tmp_path / f"copy{i}")}) for i in range(2)]
    shipments, blobs = ship_all(tasks, spool)
    assert len(blobs) == 1 == len(list(spool.iterdir()))
    assert shipments[0].stage == shipments[1].stage


def test_a_large_blob_is_packed_and_unpacked_without_being_held_in_memory(tmp_path: Path) -> None:
    """The attack on a node's memory: a 48 MiB detector. Packed to a file, and landed from a buffer in
    place (a numpy array, as Ray's object store hands it back): Python's allocations stay under 4 MiB, where
    ``pack`` (bytes) needs the blob's size and ``io.BytesIO(buffer)`` would copy it again."""
    np = pytest.importorskip("numpy")
    folder = tmp_path / "detector"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(np.random.default_rng(0).bytes(48 * 2**20))
    tracemalloc.start()
    try:
        expected, file = pack_into(folder, tmp_path)
        _, packing_peak = tracemalloc.get_traced_memory()
        mapped = np.memmap(file, dtype=np.uint8, mode="r").view(np.ndarray)
        tracemalloc.reset_peak()
        entry = unpack_cached(mapped, expected, tmp_path / "cache")
        _, landing_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        in_memory = pack(folder)
        _, bytes_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert digest(in_memory) == expected == digest(file.read_bytes())  # the same blob either way
    assert packing_peak < 4 * 2**20 and landing_peak < 4 * 2**20 < 48 * 2**20 <= bytes_peak
    assert (entry / "weights.bin").read_bytes() == (folder / "weights.bin").read_bytes()
