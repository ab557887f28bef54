"""STAR red teaming (Weidinger et al. 2024): parametric instructions, matched red teamers and annotators,
arbitration, and (later) the analysis of what the campaign found."""
