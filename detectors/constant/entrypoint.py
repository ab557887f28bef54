"""Constant baseline detector: P(trojaned) is the same for every model.

By default it answers 0.5, which scores ln 2 = 0.693 in cross entropy whatever the round. ``configure`` with
``learn_prior`` true learns the share of trojaned models in the training round instead: the best constant
under the log score when the test split has the same share. It never opens the model.

    python entrypoint.py infer --model_filepath M --result_filepath R --scratch_dirpath S \
        --examples_dirpath E --metaparameters_filepath metaparameters.json \
        --schema_filepath metaparameters_schema.json --learned_parameters_dirpath learned_parameters
"""

from __future__ import annotations

import json
import sys

from assay.trojai import ConfigureArgs, InferArgs, Metaparameters, detector_main, training_models

LEARNED = "prior.json"


def infer(args: InferArgs, meta: Metaparameters) -> float:
    learned = args.learned_parameters_dirpath / LEARNED
    if meta["learn_prior"] and learned.is_file():
        return float(json.loads(learned.read_text(encoding="utf-8"))["probability"])
    return float(meta["probability"])


def configure(args: ConfigureArgs, meta: Metaparameters) -> None:
    models = training_models(args.configure_models_dirpath)
    share = sum(m.poisoned for m in models) / len(models)
    # Kept away from 0 and 1 so one surprise cannot cost an unbounded log score.
    prior = min(max(share, 0.01), 0.99)
    record = {"probability": prior, "training_models": len(models)}
    text = json.dumps(record, indent=2) + "\n"
    (args.learned_parameters_dirpath / LEARNED).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(detector_main(infer, configure))
