"""STAR campaign analysis over the export tables (instructions, dialogues, annotations) as DataFrames:
reliability of the ratings, group effects, and coverage of the design."""

from assay.star.analysis.coverage import CoverageTable, coverage, coverage_table, evenness
from assay.star.analysis.groups import (
    final_labels,
    group_odds_ratios,
    in_group_annotation,
    interaction_tests,
    likert_distribution,
    parse_group_label,
    red_team_success,
)
from assay.star.analysis.reliability import (
    ReliabilityReport,
    arbitration_summary,
    reliability,
    reliability_matrix,
)

__all__ = [
    "CoverageTable",
    "ReliabilityReport",
    "arbitration_summary",
    "coverage",
    "coverage_table",
    "evenness",
    "final_labels",
    "group_odds_ratios",
    "in_group_annotation",
    "interaction_tests",
    "likert_distribution",
    "parse_group_label",
    "red_team_success",
    "reliability",
    "reliability_matrix",
]
