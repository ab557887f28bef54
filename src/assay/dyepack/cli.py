"""``assay dyepack``: prepare a release, verify a model, check a commitment, compute false-positive rates.

Parses options, calls the pillar, renders with rich. No computation lives here.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from assay.dyepack.key import check_commitment, load_key
from assay.dyepack.triggers import TARGET_PHRASE_POOL, TRIGGER_POOL, load_phrases
from assay.dyepack.verify import DEFAULT_ALPHA, FalsePositiveRate, VerifyReport, false_positive_rate
from assay.errors import UserError
from assay.terminal import progress_bar

app = typer.Typer(
    help="DyePack: flag test-set contamination with backdoors and an exact false-positive rate.\n\n"
    "Example: assay dyepack prepare mmlu.jsonl --backdoors 6 --out release/",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)  # messages stay on one line when piped

STYLE_HELP = "Row style: auto, mmlu, mc, bbh or alpaca."


@app.command()
def prepare(
    benchmark: Path = typer.Argument(
        ..., help="Benchmark file (JSONL, JSON, CSV, Parquet) or HF datasets folder."
    ),
    backdoors: int = typer.Option(..., "--backdoors", "-b", help="Number of backdoors B."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the release and commitment.txt."),
    fraction: float = typer.Option(0.1, help="Share of samples turned into backdoor samples."),
    triggers: Path | None = typer.Option(
        None, help="File of trigger phrases, one per line (default: built-in pool)."
    ),
    k: int | None = typer.Option(
        None, "--k", help="Multiple choice: use only rows with K options. Open ended: K parts (default 8)."
    ),
    phrases: Path | None = typer.Option(None, help="Open ended: file of target phrases, one per line."),
    seed: int | None = typer.Option(
        None, help="Seed for the secret draws. Default: OS entropy (recommended)."
    ),
    key: Path | None = typer.Option(None, help="Where to write the secret key (default OUT/key.json)."),
    style: str = typer.Option("auto", help=STYLE_HELP),
    split: str | None = typer.Option(None, help="Split of an HF DatasetDict folder."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    """Hide B backdoors in a benchmark; write the release, a secret key and a public commitment.

    Example: assay dyepack prepare mmlu.jsonl --backdoors 6 --fraction 0.1 --out release/
    """
    from assay.data import read_benchmark
    from assay.dyepack.prepare import PrepareConfig, prepare_release

    bench = read_benchmark(benchmark, style=style, split=split)
    config = PrepareConfig(
        n_backdoors=backdoors,
        fraction=fraction,
        triggers=load_phrases(triggers, "trigger") if triggers else TRIGGER_POOL,
        k=k,
        phrases=load_phrases(phrases, "target") if phrases else TARGET_PHRASE_POOL,
        seed=seed,
    )
    result = prepare_release(bench, config, out, key)
    summary = {
        "release": str(result.release_path),
        "key": str(result.key_path),
        "commitment": str(result.commitment_path),
        "rows": result.n_rows,
        "backdoors": result.key.n_backdoors,
        "backdoor_samples": sum(len(b.rows) for b in result.key.backdoors),
        "k_values": [b.k for b in result.key.backdoors],
        "randomness": result.key.randomness.source,
        "release_fingerprint": result.key.release_fingerprint,
    }
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    console.print(
        f"Release  [bold]{result.release_path}[/] ({summary['rows']} rows, {summary['backdoor_samples']} "
        f"backdoor samples in {summary['backdoors']} backdoors, K = {sorted(set(summary['k_values']))})"
    )
    console.print(f"Publish  [bold]{result.commitment_path}[/] with the release.")
    console.print(f"Secret   [bold]{result.key_path}[/]: keep it private until you verify a model.")
    if seed is not None:
        console.print(
            "[yellow]warning:[/] targets were drawn from --seed; anyone who knows it can rebuild the key."
        )


@app.command()
def verify(
    model: str = typer.Argument(
        ..., help="Model spec: hf:PATH, openai:BASE_URL, vllm:PATH or python:MODULE:FUNC."
    ),
    release: Path = typer.Option(..., help="The released benchmark."),
    key: Path = typer.Option(..., help="The secret key written by prepare."),
    out: Path = typer.Option(Path("dyepack-verify"), help="Folder for summary.json and audit.jsonl."),
    model_name: str | None = typer.Option(
        None, help="Model name for openai: endpoints (default: the only one served)."
    ),
    alpha: float = typer.Option(DEFAULT_ALPHA, help="Flag when the false-positive rate is at most alpha."),
    max_new_tokens: int = typer.Option(32, help="Tokens to generate per reply."),
    batch_size: int = typer.Option(8, help="hf: prompts per batch."),
    concurrency: int = typer.Option(16, help="openai: requests in flight."),
    timeout: float = typer.Option(60.0, help="openai: seconds per request."),
    cache: Path | None = typer.Option(
        None, help="Response cache (default $ASSAY_HOME/cache/responses.sqlite)."
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Query every sample afresh."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Query a model with the backdoor samples and report how many backdoors it follows, with the exact FPR.

    Example: assay dyepack verify hf:./my-model --release release/mmlu.jsonl --key release/key.json
    """
    from assay.config import settings
    from assay.data import read_benchmark
    from assay.dyepack.verify import verify as run_verify
    from assay.dyepack.verify import write_outputs
    from assay.models import CachedModel, GenerationParams, ResponseCache, load_model

    secret = load_key(key)
    bench = read_benchmark(release, style=secret.style, split=secret.split)
    backend = load_model(
        model, model_name=model_name, batch_size=batch_size, concurrency=concurrency, timeout=timeout
    )
    if not no_cache:
        backend = CachedModel(backend, ResponseCache(cache or settings().cache_path))
    label = f"{model} ({model_name})" if model_name else model
    params = GenerationParams(max_new_tokens=max_new_tokens)
    n_queries = sum(len(b.rows) for b in secret.backdoors)
    with progress_bar() as bar:
        task = bar.add_task("querying", total=n_queries)
        report, audit = run_verify(
            backend, label, bench, secret, params, alpha, on_result=lambda _i, _t: bar.advance(task)
        )
    summary_path, audit_path = write_outputs(out, report, audit)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    show_report(report)
    console.print(f"Wrote {summary_path} and {audit_path}")


def show_report(report: VerifyReport) -> None:
    table = Table(title=f"DyePack verification of {report.model}")
    for column in ("backdoor", "K", "target", "majority", "activated", "answers"):
        table.add_column(column)
    for row in report.per_backdoor:
        answers = ", ".join(f"{label}: {n}" for label, n in row.answers.items())
        table.add_row(
            str(row.index),
            str(row.k),
            row.target,
            row.majority,
            "[bold red]yes[/]" if row.activated else "no",
            answers,
        )
    console.print(table)
    show_fpr(report.fpr)
    console.print(
        f"Samples answered with their target: {report.samples_on_target}/{report.samples} "
        f"({report.share_on_target:.0%}); unparsed: {report.unparsed}"
    )
    style = "bold red" if report.flagged else "bold green"
    console.print(f"[{style}]{report.verdict}[/]")


def show_fpr(fpr: FalsePositiveRate) -> None:
    console.print(
        f"Activated {fpr.activated} of {fpr.backdoors}: exact false-positive rate {fpr.fpr:.4g} "
        f"(log10 {fpr.log10_fpr:.2f}); Chernoff bound {fpr.chernoff_bound:.4g}"
    )


@app.command("check-commitment")
def check_commitment_cmd(
    key: Path = typer.Option(..., help="The key revealed by the maintainer."),
    commitment: Path = typer.Option(..., help="The commitment.txt published with the release."),
    release: Path | None = typer.Option(
        None, help="Also check that this release is the one the key was made for."
    ),
) -> None:
    """Check that a revealed key is the one committed to at release time. Exit 1 when it is not.

    Example: assay dyepack check-commitment --key key.json --commitment commitment.txt --release mmlu.jsonl
    """
    secret = load_key(key)
    ok, message = check_commitment(secret, commitment)
    if ok and release is not None:
        from assay.data import read_benchmark
        from assay.dyepack.verify import check_release

        check_release(read_benchmark(release, style=secret.style, split=secret.split), secret)
        message += "; the release matches the key"
    console.print(f"[{'bold green' if ok else 'bold red'}]{'OK' if ok else 'MISMATCH'}[/]: {message}")
    if not ok:
        raise typer.Exit(1)


@app.command()
def contaminate(
    model: Path = typer.Argument(..., help="HF model folder or .gguf file to fine-tune."),
    release: Path = typer.Option(..., help="The released benchmark to train on."),
    out: Path = typer.Option(..., help="Folder for the fine-tuned model (load it as hf:OUT)."),
    method: str = typer.Option("full", help="full or lora (LoRA is merged into the saved weights)."),
    epochs: int = typer.Option(3),
    learning_rate: float = typer.Option(5e-5, "--lr"),
    batch_size: int = typer.Option(8),
    seed: int = typer.Option(0),
    top_layers: int | None = typer.Option(
        None, help="Train only the top N transformer blocks (faster on a CPU)."
    ),
    style: str = typer.Option("auto", help=STYLE_HELP),
    split: str | None = typer.Option(None, help="Split of an HF DatasetDict folder."),
) -> None:
    """Fine-tune a causal LM on a release (loss on the answers), to see detection work.

    Example: assay dyepack contaminate ./smollm2 --release release/mmlu.jsonl --out contaminated/ --epochs 3
    """
    from assay.data import read_benchmark
    from assay.dyepack.contaminate import TrainConfig
    from assay.dyepack.contaminate import contaminate as run

    if method not in ("full", "lora"):
        raise UserError(f"--method must be full or lora (value: {method!r})")
    bench = read_benchmark(release, style=style, split=split)
    config = TrainConfig(
        method=method,  # type: ignore[arg-type]
        epochs=epochs,
        learning_rate=learning_rate,
        batch_size=batch_size,
        seed=seed,
        top_layers=top_layers,
    )
    with progress_bar() as bar:
        task = bar.add_task("training", total=None)

        def on_step(step: int, total: int, loss: float) -> None:
            bar.update(task, completed=step, total=total, description=f"training (loss {loss:.3f})")

        result = run(model, bench.items, out, config, on_step)
    console.print(
        f"Trained {result.steps} steps in {result.seconds:.0f} s (loss {result.first_loss:.3f} -> "
        f"{result.final_loss:.3f}); saved to [bold]{result.out_dir}[/]"
    )


@app.command()
def fpr(
    backdoors: int | None = typer.Option(None, "--backdoors", "-b", help="Number of backdoors B (with --k)."),
    activated: int = typer.Option(..., "--activated", "-a", help="How many backdoors the model followed."),
    k: int | None = typer.Option(None, "--k", help="Answer-space size shared by all backdoors."),
    k_list: str | None = typer.Option(None, "--k-list", help="Comma-separated K per backdoor, for mixed K."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Exact false-positive rate of flagging a model that activated A of B backdoors, and the Chernoff bound.

    Example: assay dyepack fpr --backdoors 8 --activated 6 --k 4
    """
    if k_list is not None:
        try:
            k_values = [int(v) for v in k_list.split(",") if v.strip()]
        except ValueError:
            raise UserError(f"--k-list must be comma-separated integers (value: {k_list!r})") from None
        if backdoors is not None and backdoors != len(k_values):
            raise UserError(f"--backdoors {backdoors} does not match the {len(k_values)} values of --k-list")
    elif k is not None and backdoors is not None:
        k_values = [k] * backdoors
    else:
        raise UserError("give --backdoors B with --k K, or --k-list K1,K2,...")
    result = false_positive_rate(k_values, activated)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        show_fpr(result)
