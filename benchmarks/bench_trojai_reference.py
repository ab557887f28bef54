"""NIST's reference detector (usnistgov/trojai-example, branch baseline-example) in its own image, on a zoo
round exported in NIST's layout, through the leaderboard as a performer meets it.

Not part of ``make test``: it builds a 5.5 GB image (torch 2.14.1, a CUDA build, is the only torch here
with a torchvision that imports). Nothing is fetched while the detector runs; the image's packages come
from this machine's wheels (``benchmarks/trojai_standin.py``). Usage::

    python benchmarks/bench_trojai_reference.py [--work build/trojai-reference] [--variants published:sif,...]

The example's files are in ``examples/trojai-baseline/`` byte for byte (checked here against upstream's git
blob ids). Three submissions, each a step a performer takes, each built from ``detector.def`` with
``assay leaderboard image build`` and submitted with ``assay leaderboard submit``:

1. ``published``: the files as published. Only the definition file's base is changed (below).
2. ``header``: the schema's header filled in (the five fields NIST's harness refuses while they hold the
   template's own text, as ours does).
3. ``configured``: also the one line of ``detector.py`` that calls ``inference_on_example_data`` (which the
   example leaves raising ``NotImplementedError``) taken out, and ``learned_parameters/`` learned by the
   image's own ``configure`` on the round's training models (the published ``model.bin`` was pickled by a
   scikit-learn older than 1.3; the image's 1.9.1 refuses it: "node array from the pickle has an
   incompatible dtype").

The definition file's changes, the same in all three (the doc names them): ``From:`` names the stand-in
(no registry is reachable); ``%post`` checks the imports instead of ``pip install`` (the stand-in has
the packages; ``torchvision==0.14.1`` matches torch 1.13, not 2.14); ``%environment`` sets
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (torch 2.6 made a bare ``torch.load`` refuse whole modules; NIST's
torch 1.13 loads them).

It prints a table (per submission: image size, build and job times, status and answers) and writes
``WORK/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trojai_standin import standin_image

from assay.runner.container import ulimit_flags

PROJECT = Path(__file__).resolve().parents[1]
EXAMPLE = PROJECT / "examples" / "trojai-baseline"
ASSAY = str(Path(sys.executable).parent / "assay")
UPSTREAM = json.loads((EXAMPLE.parent / "trojai-baseline.json").read_text())["files"]  # git blob ids
EXAMPLE_CALL = "        self.inference_on_example_data(model, examples_dirpath)\n"  # detector.py line 179
HEADER = {  # the five fields NIST's :Schema Header: check refuses while they hold the template's text
    "title": "trojai-example baseline-example, run on assay",
    "technique_description": "trojai-example's baseline: random features through a random forest regressor",
    "technique_changes": "none to the technique; schema header filled in, example-data call removed",
    "commit_id": "1e8b348ac75a619c01e08572e4b1e55e6ef58848",
    "repo_name": "https://github.com/usnistgov/trojai-example (baseline-example) via assay",
}
HEADER_TAG = "localhost/trojai-ref-header:latest"
IMPORTS = "torch, torchvision, sklearn, skimage, jsonpickle, jsonschema, jsonargparse, tqdm"


def blob_id(path: Path) -> str:
    """git's blob id of a file (``git hash-object``): names the exact bytes upstream published."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_upstream() -> None:
    """Stop unless every vendored file is upstream's, byte for byte."""
    changed = [name for name, blob in UPSTREAM.items() if blob_id(EXAMPLE / name) != blob]
    if changed:
        raise SystemExit(f"examples/trojai-baseline differs from upstream: {', '.join(changed)}")


def adapted_definition(text: str, base: str) -> str:
    """detector.def with its base, %post and %environment changed as the module docstring says."""
    lines = text.splitlines()
    out, section = [], ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("%"):
            section = stripped
        if line.startswith("Bootstrap:"):
            out.append("Bootstrap: docker")
        elif line.startswith("From:"):
            out.append(f"From: {base}")
        elif section == "%post" and stripped.startswith("pip install"):
            out.append(f"    # was: {stripped}")
        elif stripped == "%runscript":
            out += [
                f'    python3 -c "import {IMPORTS}"',
                "",
                "%environment",
                "    export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1",
            ]
            out += ["", line]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def context_for(variant: str, work: Path, base: str, learned: Path | None) -> Path:
    """The build folder of one submission: the example's files, changed as ``variant`` asks."""
    folder = work / "contexts" / variant
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(EXAMPLE, folder)
    (folder / "detector.def").write_text(adapted_definition((EXAMPLE / "detector.def").read_text(), base))
    if variant in ("header", "configured"):
        schema_path = folder / "metaparameters_schema.json"
        schema = json.loads(schema_path.read_text())
        schema.update(HEADER)
        schema_path.write_text(json.dumps(schema, indent=2) + "\n")
    if variant == "configured":
        detector = folder / "detector.py"
        text = detector.read_text()
        assert text.count(EXAMPLE_CALL) == 1
        detector.write_text(
            text.replace(EXAMPLE_CALL, "        # (assay: the example's NotImplementedError call removed)\n")
        )
        shutil.rmtree(folder / "learned_parameters")
        shutil.copytree(learned, folder / "learned_parameters")
    return folder


def run(argv: list[str], env: dict[str, str], log: Path, check: bool = True) -> tuple[int, str, float]:
    """A command as the user types it; its output appended to ``log``; (exit code, output, seconds)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    with log.open("a") as handle:
        handle.write(
            f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}[exit {done.returncode}, {seconds:.1f} s]\n"
        )
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.returncode, done.stdout + done.stderr, seconds


def zoo_round(work: Path, env: dict[str, str], log: Path) -> Path:
    """The 16-model digits round of examples/zoo-round.yaml, split, exported in NIST's layout and imported
    back: the round folder the leaderboard runs."""
    nist, imported = work / "round-nist", work / "round"
    if (imported / "split.json").exists():
        return imported
    for folder in (work / "zoo", nist, imported):
        shutil.rmtree(folder, ignore_errors=True)
    run(
        [
            ASSAY,
            "zoo",
            "generate",
            "--config",
            str(PROJECT / "examples/zoo-round.yaml"),
            "--out",
            str(work / "zoo"),
        ],
        env,
        log,
    )
    run([ASSAY, "zoo", "split", str(work / "zoo"), "--seed", "1"], env, log)
    run([ASSAY, "zoo", "export-nist", str(work / "zoo" / "splits"), "--out", str(nist)], env, log)
    run([ASSAY, "zoo", "import-nist", str(nist), "--out", str(imported)], env, log)
    return imported


def build(
    context: Path, out: Path, env: dict[str, str], log: Path, tag: str | None = None
) -> tuple[float, int]:
    out.unlink(missing_ok=True)
    argv = [ASSAY, "leaderboard", "image", "build", str(context / "detector.def"), "--out", str(out)]
    _, _, seconds = run(argv + (["--tag", tag] if tag else []), env, log)
    return seconds, out.stat().st_size


def configure(ref: str, round_dir: Path, work: Path, env: dict[str, str], log: Path) -> Path:
    """The image's own ``configure`` on the training models, as a performer runs it before submitting:
    ``podman run`` with no network, the models read-only, the learned parameters written to a folder."""
    learned = work / "learned_parameters"
    shutil.rmtree(learned, ignore_errors=True)
    learned.mkdir(parents=True)
    shutil.copy(EXAMPLE / "learned_parameters" / "README.md", learned / "README.md")
    try:
        argv = [
            "podman",
            "run",
            "--rm",
            "--runtime",
            "runc",
            "--network",
            "none",
            *ulimit_flags(),
        ]
        argv += ["-v", f"{round_dir / 'train' / 'models'}:/models:ro", "-v", f"{learned}:/learned"]
        argv += [ref, "configure", "--scratch_dirpath", "/tmp", "--configure_models_dirpath", "/models"]
        argv += [
            "--metaparameters_filepath",
            "/metaparameters.json",
            "--schema_filepath",
            "/metaparameters_schema.json",
        ]
        argv += ["--learned_parameters_dirpath", "/learned"]
        run(argv, env, log)
    finally:
        run(["podman", "rmi", "--force", ref], env, log, check=False)
    return learned


def leaderboard(work: Path, round_dir: Path, env: dict[str, str], log: Path) -> None:
    """The board, once per work folder (a rerun adds its submissions to the same round)."""
    if (work / "lb.db").exists():
        return
    run([ASSAY, "leaderboard", "init"], env, log)
    create = [ASSAY, "leaderboard", "round", "create", "trojai-ref", "--dataset", str(round_dir)]
    create += ["--per-model-timeout", "600", "--memory-gb", "12", "--max-image-gb", "8", "--quota-gb", "40"]
    create += ["--scratch-gb", "2"]
    run(create, env, log)
    run([ASSAY, "leaderboard", "round", "open", "trojai-ref"], env, log)


def submit_and_run(variant: str, image: Path, env: dict[str, str], log: Path) -> dict:
    run([ASSAY, "leaderboard", "team", "add", variant], env, log, check=False)  # there from an earlier run
    submit = [
        ASSAY,
        "leaderboard",
        "submit",
        str(image),
        "--team",
        variant,
        "--round",
        "trojai-ref",
        "--split",
        "test",
    ]
    submit.append("--json")
    code, output, submit_s = run(submit, env, log, check=False)
    answer = json.loads(output[output.index("{") : output.rindex("}") + 1])
    row = {
        "variant": variant,
        "submit_exit": code,
        "submit_s": round(submit_s, 1),
        "status": answer["status"],
    }
    if code != 0:
        row["refused"] = answer["errors"]
        return row
    _, _, row["job_s"] = run([ASSAY, "leaderboard", "worker", "--once", "--workers", "1"], env, log)
    shown = run([ASSAY, "leaderboard", "results", str(answer["submission"]), "--json"], env, log)[1]
    row["results"] = json.loads(shown)
    return row
    submission = json.loads(output[output.index("{") :])["id"]
    _, _, row["job_s"] = run([ASSAY, "leaderboard", "worker", "--once", "--workers", "1"], env, log)
    row["results"] = json.loads(
        run([ASSAY, "leaderboard", "results", str(submission), "--json"], env, log)[1]
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=PROJECT / "build" / "trojai-reference")
    parser.add_argument(
        "--variants", default="published:sif,header:tar,configured:sif", help="NAME:sif|tar,..."
    )
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    env = {**os.environ, "ASSAY_DB_URL": f"sqlite:///{work / 'lb.db'}", "ASSAY_HOME": str(work / "home")}
    check_upstream()
    cpu = platform.processor() or platform.machine()
    when = time.strftime("%F %T %Z")
    print(f"machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {when}")
    start = time.perf_counter()
    base = standin_image(work)
    print(f"stand-in base {base}: {time.perf_counter() - start:.0f} s")
    round_dir = zoo_round(work, env, log)
    leaderboard(work, round_dir, env, log)
    saved = work / "results.json"
    rows = json.loads(saved.read_text()) if saved.exists() else []
    learned = None
    for variant, image_format in (item.split(":") for item in args.variants.split(",")):
        if variant == "configured":  # the header image learns the parameters the configured one ships
            learned = configure(HEADER_TAG, round_dir, work, env, log)
        image = work / f"{variant}.{image_format}"
        tag = HEADER_TAG if variant == "header" else None
        build_s, size = build(context_for(variant, work, base, learned), image, env, log, tag)
        row = {"image_bytes": size, "build_s": round(build_s, 1), **submit_and_run(variant, image, env, log)}
        rows = [r for r in rows if r["variant"] != variant] + [row]
        row["format"] = image_format
        image.unlink()  # 5.5 GB each; the leaderboard keeps its own copy
        saved.write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    """One line per submission: image, build time, what the leaderboard made of it."""
    lines = [
        "| submission | image | build | status | job | answers | cross entropy |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        image = f"{row.get('format', '?')} {row['image_bytes'] / 2**30:.2f} GiB"
        results = row.get("results") or {}
        answers = sorted({m["answer"] for m in results.get("models", [])})
        flags = sorted({m["flags"] for m in results.get("models", []) if m["flags"]})
        status = results.get("status", row["status"])
        if row.get("refused"):
            status = f"refused: {row['refused'][0][:90]}"
        job = f"{row['job_s']:.0f} s" if "job_s" in row else "-"
        ce = results.get("metrics", {}).get("cross_entropy")
        shown = ", ".join(map(str, answers)) + (f" ({', '.join(flags)})" if flags else "")
        ce_text = f"{ce:.4f}" if ce is not None else "-"
        cells = (row["variant"], image, f"{row['build_s']:.0f} s", status, job, shown, ce_text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
