"""assay: rigorous adversarial evaluation of AI models.

Three pillars share one core and are put in front of people by two faces:

Pillars (they never import each other's internals):

- ``assay.dyepack``: hide backdoor "dye packs" in a test set before release, then flag a model that
  trained on it from its text output alone, with an exact false-positive rate (DyePack).
- ``assay.zoo`` + ``assay.leaderboard``: generate rounds of clean and trojaned models, run submitted trojan
  detectors in a sandbox on sequestered splits, score them (log score with confidence intervals), rank them
  and close rounds on a holdout split (the NIST TrojAI leaderboard).
- ``assay.star``: procedurally generated red-teaming instructions, demographic and expert matching of red
  teamers and annotators, two annotators and an arbitrator, and the reliability, group-difference and
  thematic analyses (STAR).

Core: ``assay.stats`` (pure functions), ``assay.models`` (one chat protocol, backends by spec string, a
response cache), ``assay.data`` (benchmark files with precise errors), ``assay.runner`` (sandboxed work
units), ``assay.store`` (SQLAlchemy tables and migrations), ``assay.trojai`` (the TrojAI detector contract),
and the small shared helpers ``assay.errors``, ``assay.retry``, ``assay.fileio`` and ``assay.config``.

Faces (parse and render, never compute): ``assay.cli`` (the ``assay`` command, one sub-app per pillar, and
``assay user``/``assay serve``) and ``assay.web`` (pages and the JSON API under ``/api/v1``). The map of
every module is ``docs/architecture.md``.
"""

__version__ = "0.1.0"
