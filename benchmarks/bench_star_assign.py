"""STAR claim throughput: red-team tasks claimed per second with 1 and 4 claimer processes on one SQLite file.

Each run builds a fresh database (the example-like spec: a group-targeted rule over race x gender, a medical
rule, a plain rule; ``--tasks`` instructions; ``--people`` red teamers with mixed demographics and no cap
in reach) and lets the claimer processes, released together, claim until nothing is left. Every claim is
the engine's atomic conditional UPDATE, so the processes compete for SQLite's single writer lock.

    python benchmarks/bench_star_assign.py --tasks 2000 --people 16 --claimers 1 4

Prints a table; ratios are against the first claimer count. Process start-up and the store's migration
check are outside the timed part. Run on a quiet machine: the claimers compete with anything else.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time


def build(url: str, tasks: int, people: int) -> list[int]:
    """A campaign with ``tasks`` red-team tasks and ``people`` red teamers; their ids."""
    from assay.star.assign import add_instructions, create_campaign
    from assay.star.spec import CampaignSpec, group_label
    from assay.store import StarParticipant, open_store

    spec = CampaignSpec.model_validate(
        {
            "name": "bench",
            "rules": [
                {"id": "hate", "text": "no hate", "area": "hate", "targets_groups": True},
                {"id": "medical", "text": "no harm", "area": "medical", "expertise": ["medical"]},
                {"id": "plain", "text": "be kind", "area": "misc"},
            ],
            "demographics": {"attributes": {"race": ["A", "B", "C", "D"], "gender": ["f", "m", "x"]}},
            "templates": {"default": "Break {{ rule.text }}"},
        }
    )
    groups = spec.demographics.groups()
    rules = ["hate", "medical", "plain"]
    instructions = []
    for i in range(tasks):
        rule = rules[i % 3]
        group = groups[i % len(groups)] if rule == "hate" else None
        row = {"number": i, "id": f"ins-{i:05d}", "rule_id": rule, "group": group, "text": f"instruction {i}"}
        instructions.append(
            row | {"group_label": group_label(group), "parameters": {}, "template": "default"}
        )
    sessions = open_store(url)
    with sessions.begin() as session:
        campaign = create_campaign(session, spec, seed=1)
        add_instructions(session, campaign, instructions)
        rows = [
            StarParticipant(
                campaign_id=campaign.id,
                external_id=f"p{i}",
                demographics={"race": ["ABCD"[i % 4]], "gender": ["fmx"[i % 3]]},
                roles=["red_teamer"],
                daily_cap=1_000_000,
            )
            for i in range(people)
        ]
        session.add_all(rows)
        session.flush()
        return [row.id for row in rows]


def claimer(url: str, people: list[int], barrier) -> tuple[float, float, int]:
    """Worker: claim for its people in turn until none gets anything; (start, end, claims)."""
    from assay.star.assign import claim_next
    from assay.store import open_store

    sessions = open_store(url)
    barrier.wait()
    start, claims, active = time.perf_counter(), 0, list(people)
    while active:
        for person in list(active):
            if claim_next(sessions, person, "red_team") is None:
                active.remove(person)
            else:
                claims += 1
    return start, time.perf_counter(), claims


def run(tasks: int, people: int, claimers: int) -> tuple[float, int]:
    """Seconds from the common start to the last claimer's end, and tasks claimed in all."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/bench.db"
        ids = build(url, tasks, people)
        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager, context.Pool(claimers) as pool:
            barrier = manager.Barrier(claimers)
            pending = [pool.apply_async(claimer, (url, ids[i::claimers], barrier)) for i in range(claimers)]
            results = [p.get() for p in pending]
    seconds = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    return seconds, sum(n for _, _, n in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--people", type=int, default=16)
    parser.add_argument("--claimers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()

    rows = [(n, *run(args.tasks, args.people, n)) for n in args.claimers]
    base = rows[0][2] / rows[0][1]
    print(f"{args.tasks} red-team tasks, {args.people} red teamers, SQLite (WAL), {os.cpu_count()} CPUs")
    print(f"{'claimers':>8} {'seconds':>9} {'claimed':>8} {'tasks/s':>9} {'ratio':>7}")
    for claimers, seconds, claimed in rows:
        rate = claimed / seconds
        print(f"{claimers:>8} {seconds:>9.2f} {claimed:>8} {rate:>9.1f} {rate / base:>6.2f}x")


if __name__ == "__main__":
    main()
