"""Model zoo: TrojAI-style rounds of small clean and trojaned image classifiers."""
