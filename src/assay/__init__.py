"""assay: rigorous adversarial evaluation of AI models.

Pillars: ``assay.dyepack`` (contamination flags), and later ``assay.zoo``/``assay.leaderboard`` and
``assay.star``; they stand on the core packages ``assay.stats``, ``assay.models`` and ``assay.data``.
"""

__version__ = "0.1.0"
