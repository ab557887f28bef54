"""Leaderboard: TrojAI-style rounds of trojan detection, and the scoring of detectors' predictions."""
