"""STAR campaign analysis over the export tables (instructions, dialogues, annotations) as DataFrames:
reliability of the ratings, group effects (default tests respect clustering, ``inference.py``; the seed
paper's t-tests and ANOVAs in ``paper.py``), and coverage of the design."""

from assay.star.analysis.coverage import CoverageTable, coverage, coverage_table, evenness
from assay.star.analysis.embed import (
    Embedder,
    EmbeddingCache,
    HashingEmbedder,
    MiniLMEmbedder,
    dialogue_text,
    embed_texts,
    make_embedder,
)
from assay.star.analysis.groups import (
    dialogue_outcomes,
    final_labels,
    group_odds_ratios,
    in_group_annotation,
    interaction_tests,
    likert_distribution,
    parse_group_label,
    red_team_success,
)
from assay.star.analysis.paper import paper_tests
from assay.star.analysis.reliability import (
    ReliabilityReport,
    arbitration_summary,
    reliability,
    reliability_matrix,
)
from assay.star.analysis.themes import (
    ThemeMap,
    class_tfidf_terms,
    points_frame,
    table_frame,
    thematic_map,
)

__all__ = [
    "CoverageTable",
    "Embedder",
    "EmbeddingCache",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "ReliabilityReport",
    "ThemeMap",
    "arbitration_summary",
    "class_tfidf_terms",
    "coverage",
    "coverage_table",
    "dialogue_outcomes",
    "dialogue_text",
    "embed_texts",
    "evenness",
    "final_labels",
    "group_odds_ratios",
    "in_group_annotation",
    "interaction_tests",
    "likert_distribution",
    "make_embedder",
    "paper_tests",
    "parse_group_label",
    "points_frame",
    "red_team_success",
    "reliability",
    "reliability_matrix",
    "table_frame",
    "thematic_map",
]
