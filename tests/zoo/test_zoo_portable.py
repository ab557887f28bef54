"""Zoo model files load anywhere: plain ``torch.load`` without ``assay`` importable, and weights alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from assay.errors import UserError
from assay.trojai import load_model
from assay.zoo.architectures import ARCHITECTURES, build_model
from assay.zoo.portable import WEIGHTS_FILE, load_weights, save_model, save_weights

SHAPES = {"digits": (8, 8), "mnist": (28, 28)}

# Runs in a fresh interpreter where `import assay` fails: assay's source folder is off sys.path and an import
# hook refuses the name, so nothing of ours can sneak in through an editable install's path hook either.
OUTSIDER = textwrap.dedent(
    """
    import json, sys
    sys.path[:] = [p for p in sys.path if not p.startswith(%(src)r)]
    class NoAssay:
        def find_spec(self, name, path=None, target=None):
            if name == "assay" or name.startswith("assay."):
                raise ImportError("assay is not installed here")
    sys.meta_path.insert(0, NoAssay())
    try:
        import assay
    except ImportError:
        pass
    else:
        raise SystemExit("assay was importable")
    import torch
    from safetensors.torch import load_file
    torch.set_num_threads(1)  # as the probe was computed (see one_thread)
    report = {}
    for folder in sys.argv[1:]:
        path = folder + "/model.pt"
        model = torch.load(path, weights_only=False) if %(explicit)r else torch.load(path)
        probe = torch.load(folder + "/probe.pt")
        with torch.no_grad():
            same = torch.equal(model(probe["x"]), probe["y"])
        weights = load_file(folder + "/model.safetensors")
        state = model.state_dict()
        report[folder] = {
            "class": model.__class__.__name__,
            "same_output": same,
            "same_keys": sorted(weights) == sorted(state),
            "same_weights": all(torch.equal(weights[k], state[k]) for k in weights),
            "modules": sorted({type(m).__module__.split(".")[0] for m in model.modules()}),
        }
    print(json.dumps(report))
    """
)


@pytest.fixture(autouse=True)
def one_thread():
    """Outputs are compared bit for bit, and the last bit of a reduction follows the number of threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _write(tmp_path, family: str, shape: tuple[int, int]):
    torch.manual_seed(7)
    model = build_model(family, 8, shape, 10).eval()
    with torch.no_grad():  # move BatchNorm statistics off their defaults, so the buffers are checked too
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.uniform_(0.5, 1.5)
    folder = tmp_path / f"{family}-{shape[0]}"
    folder.mkdir()
    save_model(model, folder / "model.pt")
    save_weights(model, folder / WEIGHTS_FILE)
    reduced = {"architecture": family, "width": 8, "input_shape": list(shape), "num_classes": 10}
    (folder / "reduced-config.json").write_text(json.dumps(reduced), encoding="utf-8")
    x = torch.rand(5, *shape)
    with torch.no_grad():
        torch.save({"x": x, "y": model(x)}, folder / "probe.pt")
    return model, folder


def _outsider(folders, explicit: bool, env: dict[str, str] | None = None) -> dict:
    src = os.path.dirname(os.path.dirname(sys.modules["assay"].__file__))
    script = OUTSIDER % {"src": src, "explicit": explicit}
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_every_architecture_loads_without_assay(tmp_path):
    written = {
        (family, shape): _write(tmp_path, family, shape)[1]
        for family in ARCHITECTURES
        for shape in SHAPES.values()
    }
    report = _outsider(written.values(), explicit=True)
    classes = {"cnn_small": "CnnSmall", "resnet_tiny": "ResNetTiny", "mlp": "Mlp"}
    assert len(report) == 2 * len(ARCHITECTURES)
    for (family, _), folder in written.items():
        seen = report[str(folder)]
        assert seen["same_output"], family
        assert seen["same_keys"] and seen["same_weights"], family
        assert seen["class"] == classes[family]  # NIST's example groups models by class name
        assert seen["modules"] == ["torch"]


@pytest.mark.slow
def test_bare_torch_load_works_with_nists_default(tmp_path):
    """NIST's example calls torch.load(path) bare; torch >= 2.6 defaults to weights_only=True, which refuses
    any whole module. The harness sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for detectors, which restores the
    default NIST's containers have (torch 1.13)."""
    _, folder = _write(tmp_path, "resnet_tiny", (8, 8))
    report = _outsider([folder], explicit=False, env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert report[str(folder)]["same_output"]


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_portable_file_loads_through_assay_too(tmp_path, family):
    _, folder = _write(tmp_path, family, (8, 8))
    loaded = load_model(folder / "model.pt")
    probe = torch.load(folder / "probe.pt")
    with torch.no_grad():
        assert torch.equal(loaded(probe["x"]), probe["y"])
    # channel-first input, and an RGB copy of the gray image (NIST-style detectors feed RGB examples), give
    # the same answer as (N, H, W)
    with torch.no_grad():
        assert torch.equal(loaded(probe["x"][:, None]), probe["y"])
        assert torch.allclose(loaded(probe["x"][:, None].expand(-1, 3, -1, -1)), probe["y"], atol=1e-6)


def test_weights_only_form_rebuilds_the_model(tmp_path):
    _, folder = _write(tmp_path, "resnet_tiny", (28, 28))
    rebuilt = load_weights(folder)
    probe = torch.load(folder / "probe.pt")
    with torch.no_grad():
        assert torch.equal(rebuilt(probe["x"]), probe["y"])


def test_weights_that_do_not_fit_are_named(tmp_path):
    _, folder = _write(tmp_path, "mlp", (8, 8))
    reduced = json.loads((folder / "reduced-config.json").read_text())
    (folder / "reduced-config.json").write_text(json.dumps({**reduced, "width": 16}))
    with pytest.raises(UserError, match=r"model\.safetensors: does not fit mlp"):
        load_weights(folder)
    (folder / "reduced-config.json").write_text("{}")
    with pytest.raises(UserError, match=r"reduced-config\.json: not an architecture description"):
        load_weights(folder)


def test_equal_weights_give_equal_bytes(tmp_path):
    """Ray moves model folders by content hash (issue 27): safetensors writes its metadata from a Rust
    HashMap, so the same model saved twice came out in either key order (2 distinct files in 30 saves)."""
    import hashlib

    from safetensors.torch import load_file

    model = build_model("mlp", 8, SHAPES["digits"], 10)
    digests = set()
    for n in range(30):
        saved = save_weights(model, tmp_path / f"m{n}.safetensors")
        digests.add(hashlib.sha256(saved.read_bytes()).hexdigest())
    assert len(digests) == 1
    loaded = load_file(tmp_path / "m0.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
