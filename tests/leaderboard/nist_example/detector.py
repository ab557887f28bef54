"""A detector written to NIST's trojai-example conventions (baseline-example branch), for assay's tests.

entrypoint.py and utils/ are NIST's files, byte for byte (usnistgov/trojai-example, branch baseline-example,
commit 1e8b348ac75a619c01e08572e4b1e55e6ef58848). This file follows NIST's detector.py: the Detector class,
metaparameters read with json, models loaded through utils.models.load_model (a bare torch.load), the
model's config.json read beside it, and a scikit-learn model learned in configure mode or, when no learned
parameters exist, fitted at inference time on the round's training dataset.
"""

import json
import logging
import os
import pickle

import jsonpickle
import numpy as np
import skimage.io
from sklearn.linear_model import LogisticRegression

from utils.abstract import AbstractDetector
from utils.models import load_ground_truth, load_model


def features(model_repr):
    """Weight statistics of the last layer (its rows hold the target class's trojan signature)."""
    last = [value for name, value in model_repr.items() if name.endswith("weight")][-1]
    rows = np.abs(last).sum(axis=1)
    return np.array([rows.max() / rows.mean(), last.std(), np.abs(last).max() / (last.std() + 1e-12)])


class Detector(AbstractDetector):
    def __init__(self, metaparameter_filepath, learned_parameters_dirpath):
        metaparameters = json.load(open(metaparameter_filepath, "r"))
        self.learned_parameters_dirpath = learned_parameters_dirpath
        self.model_filepath = os.path.join(learned_parameters_dirpath, "model.bin")
        self.regularisation = metaparameters["infer_regularisation"]

    def _fit(self, models_dirpath):
        X, y = [], []
        for name in sorted(os.listdir(models_dirpath)):
            model_dirpath = os.path.join(models_dirpath, name)
            _, model_repr, _ = load_model(os.path.join(model_dirpath, "model.pt"))
            X.append(features(model_repr))
            y.append(load_ground_truth(model_dirpath))
        logging.info("Fitted on %d models", len(y))
        return LogisticRegression(C=self.regularisation).fit(np.vstack(X), y)

    def automatic_configure(self, models_dirpath):
        self.manual_configure(models_dirpath)

    def manual_configure(self, models_dirpath):
        os.makedirs(self.learned_parameters_dirpath, exist_ok=True)
        with open(self.model_filepath, "wb") as fp:
            pickle.dump(self._fit(models_dirpath), fp)

    def infer(self, model_filepath, result_filepath, scratch_dirpath, examples_dirpath,
              round_training_dataset_dirpath):
        model, model_repr, model_class = load_model(model_filepath)
        with open(os.path.join(os.path.dirname(model_filepath), "config.json")) as fp:
            config = json.load(fp)
        examples = sorted(name for name in os.listdir(examples_dirpath) if name.endswith((".png", ".jpg")))
        first = skimage.io.imread(os.path.join(examples_dirpath, examples[0]))
        if os.path.exists(self.model_filepath):
            with open(self.model_filepath, "rb") as fp:
                classifier = pickle.load(fp)
        else:
            classifier = self._fit(os.path.join(round_training_dataset_dirpath, "models"))
        probability = float(classifier.predict_proba(features(model_repr)[None])[0, 1])
        logging.info("%s (%s, %d classes, %d examples of %s): %s", model_class, config["architecture"],
                     config["num_classes"], len(examples), first.shape, jsonpickle.encode(probability))
        with open(result_filepath, "w") as fp:
            fp.write(str(probability))
