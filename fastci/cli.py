"""The `fastci` command line: the front door that composes the runner and the app.

Every error FastCI raises on purpose derives from `FastCIError` and carries its exit code
(the table is in `fastci.runner.errors`); `main` catches it in one place.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from typing import Sequence

from fastci import __version__
from fastci.runner.errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    FastCIError,
    RunError,
    UsageError,
)


def _progress(quiet: bool):
    def say(message: str) -> None:
        if not quiet:
            print(f"fastci: {message}…", file=sys.stderr, flush=True)
    return say


RUNS_PYTEST = ("record", "run")  # the commands that pass arguments after `--` to pytest


def _split_pytest_args(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _engine(args):
    from fastci.runner.engine import Engine  # noqa: PLC0415

    return Engine(args.repo, args.store, progress=_progress(getattr(args, "quiet", False)))


def cmd_record(args, pytest_args) -> int:
    engine = _engine(args)
    code = engine.record(pytest_args)
    if code in (0, 1):
        return code
    raise RunError(f"pytest exited with code {code}; nothing was recorded"
                   if code != 5 else "pytest collected no tests; nothing was recorded")


def cmd_select(args) -> int:
    from fastci.render import selection_table  # noqa: PLC0415

    engine = _engine(args)
    planned = engine.plan(args.base, args.head or "WORKTREE", prune=not args.no_prune,
                          all_tests=args.all_tests)
    sel = planned.selection
    if args.format == "json":
        out = sel.to_json()
        out["summary"]["selection_seconds"] = round(planned.seconds, 4)
        print(json.dumps(out, indent=2))
    elif args.format == "ids":
        for d in sel.selected:
            print(d.test_id)
    else:
        print(selection_table(sel, show_skipped=args.show_skipped))
        print(f"(decided in {planned.seconds * 1000:.0f} ms)")
    return EXIT_OK


def cmd_run(args, pytest_args) -> int:
    from fastci.render import run_summary, selection_table, verdict  # noqa: PLC0415

    engine = _engine(args)

    def on_verdict(partial) -> None:
        print(selection_table(partial.selection, limit=20))
        print(verdict(partial), flush=True)

    report = engine.run(args.base, pytest_args, run_all=args.all, on_verdict=on_verdict,
                        background=not args.no_background, prune=not args.no_prune,
                        all_tests=args.all_tests)
    print(run_summary(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_json(), fh, indent=2)
    if report.blocking_failures:
        return EXIT_FAILED
    # pytest's 5 means every test was deselected in that phase: a valid selection.
    bad = {name: code for name, code in report.extra["pytest_exit_codes"].items()
           if code not in (0, 1, 5)}
    if bad:
        raise RunError("pytest could not run: " + ", ".join(f"{n} tests exited {c}"
                                                            for n, c in bad.items()))
    return EXIT_OK


def cmd_explain(args) -> int:
    from fastci.render import explain  # noqa: PLC0415

    engine = _engine(args)
    planned = engine.plan(args.base, args.head or "WORKTREE", prune=not args.no_prune)
    sel = planned.selection
    ids = [d.test_id for d in sel.decisions]
    test_id = args.test_id
    if sel.decision(test_id) is None:
        prefix = [i for i in ids if i.startswith(test_id)]
        if len(prefix) == 1:
            test_id = prefix[0]
        else:
            close = prefix[:5] or difflib.get_close_matches(test_id, ids, n=5, cutoff=0.5)
            hint = ("; did you mean: " + ", ".join(close)) if close else ""
            raise UsageError(f"unknown test id {args.test_id!r} (it has no evidence and is not "
                           f"a test function at the head){hint}")
    evidence = planned.snapshot.tests.get(test_id) if planned.snapshot else None
    kept = planned.pruning.kept.get(test_id) if planned.pruning else None
    print(explain(sel, test_id, evidence, not_pruned=kept))
    return EXIT_OK


def cmd_demo(args) -> int:
    from fastci.demo import run_demo  # noqa: PLC0415

    if args.app:
        return _demo_app(args)
    outcomes = run_demo(args.workdir, args.out, jobs=args.jobs, only=args.only)
    missed = sum(len(o.missed) for o in outcomes)
    if missed:
        print(f"fastci demo: {missed} known failing test(s) were not selected", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _demo_app(args) -> int:
    from fastci.demo_app import run_app_demo  # noqa: PLC0415

    if args.only and len(args.only) > 1:
        raise UsageError("--app runs one change: give --only once")
    try:
        run_app_demo(args.workdir, (args.only or ["rope_bug"])[0])
    except FileNotFoundError as exc:
        raise RunError(str(exc)) from None
    return EXIT_OK


def cmd_serve(args) -> int:
    from fastci.app.serve import serve  # noqa: PLC0415

    serve(args.bind, args.workers)
    return EXIT_OK


def cmd_worker(args) -> int:
    from fastci.app.serve import work  # noqa: PLC0415

    if args.gpu is not None and args.gpu < 0:
        raise UsageError("--gpu must be a GPU index (0, 1, ...)")
    work(gpu=args.gpu, cpu=args.cpu, burst=args.burst, name=args.name)
    return EXIT_OK


def cmd_audit(args) -> int:
    import time  # noqa: PLC0415

    from fastci.render import audit_table  # noqa: PLC0415

    if args.since_days is not None and args.since_days < 0:
        raise UsageError("--since-days must not be negative")
    since = time.time() - args.since_days * 86400 if args.since_days is not None else 0.0
    with _engine(args).open_store(create=False) as store:
        entries = store.audits(since)
    if args.json:
        print(json.dumps(entries, indent=2))
    else:
        text = f"in the last {args.since_days:g} days" if args.since_days is not None \
            else "in the store"
        print(audit_table(entries, text))
        given_up = _given_up_deliveries(since)
        if given_up is not None:
            print(given_up)
    return EXIT_FAILED if any(e["missed"] for e in entries) else EXIT_OK


def _given_up_deliveries(since: float) -> str | None:
    """On the App's host (FASTCI_REDIS_URL set): the webhook deliveries the watchdog gave up
    redelivering, as lines; None elsewhere."""
    if not os.environ.get("FASTCI_REDIS_URL"):
        return None
    import datetime  # noqa: PLC0415

    from redis import Redis  # noqa: PLC0415
    from redis.exceptions import RedisError  # noqa: PLC0415

    from fastci.app.settings import load  # noqa: PLC0415
    from fastci.app.watchdog import given_up  # noqa: PLC0415

    settings = load()
    try:
        records = given_up(Redis.from_url(settings.redis_url, socket_connect_timeout=2),
                           settings.queue_prefix, since)
    except RedisError as exc:
        return f"\n(could not read the watchdog's records from Redis: {type(exc).__name__})"
    if not records:
        return "\nthe watchdog gave up redelivering no webhook delivery"
    lines = [f"\nthe watchdog gave up redelivering {len(records)} webhook delivery(ies) "
             "(GitHub's Advanced tab of the App lists them):"]
    for r in records:
        when = datetime.datetime.fromtimestamp(r["at"]).strftime("%Y-%m-%d %H:%M")
        event = f"{r.get('event')}" + (f".{r['action']}" if r.get("action") else "")
        lines.append(f"    {when}  {r['guid']}  {event}  answered {r.get('status_code')}, "
                     f"asked {r.get('asked')} time(s)")
    return "\n".join(lines)


def cmd_gc(args) -> int:
    import time  # noqa: PLC0415

    from fastci.render import gc_table  # noqa: PLC0415
    from fastci.runner.store.retention import Retention, branch_histories, check_days  # noqa: PLC0415

    if args.keep_days is not None:
        check_days(args.keep_days)  # before any git or store work: a usage error is cheap
    engine = _engine(args)
    days = check_days(engine.settings.retention_days if args.keep_days is None
                      else args.keep_days)
    retention = Retention(keep_days=days, now=time.time(),
                          branches=branch_histories(engine.repo.root))
    with engine.open_store(create=False) as store:
        report = store.gc(retention, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(gc_table(report))
    return EXIT_OK


def cmd_watchdog(args) -> int:
    from fastci.app.watchdog import run  # noqa: PLC0415

    run(interval=args.interval, once=args.once)
    return EXIT_OK


ALL_TESTS_HELP = ("decide every test of the repository, not only those the evidence's "
                  "recorded pytest arguments (test paths, -k, -m) collect; `run` stores the "
                  "widened scope")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastci",
        description="Run only the tests a change can affect, riskiest first, and say why.",
        epilog="Exit codes: 0 ok, 1 tests failed, 2 usage, 3 git, 4 evidence store, 5 pytest.")
    parser.add_argument("--version", action="version", version=f"fastci {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo", default=".", help="repository (default: the current one)")
    common.add_argument("--store", default=None,
                        help="evidence store: a file or a redis:// URL (default: [tool.fastci] "
                             "store or $FASTCI_STORE, relative to the repository; else "
                             ".fastci/evidence.db)")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    prune = argparse.ArgumentParser(add_help=False)
    prune.add_argument("--no-prune", action="store_true",
                       help="skip equivalent-context pruning (replaying captured module "
                            "and function calls under the new code)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("record", parents=[common],
                       help="run the tests and record per-test evidence for HEAD",
                       description="Run pytest over the suite and record each test's "
                                   "evidence. Arguments after -- go to pytest.")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("select", parents=[common, prune],
                       help="which tests a change can affect, why, in which order",
                       description="Decide every test against the evidence of the base.")
    p.add_argument("--base", default=None,
                   help="revision with evidence (default: merge base with the default "
                        "branch, else the nearest ancestor with evidence)")
    p.add_argument("--head", default=None,
                   help="revision to select for (default: the working tree)")
    p.add_argument("--format", choices=("table", "json", "ids"), default="table")
    p.add_argument("--show-skipped", action="store_true", help="list skipped tests too")
    p.add_argument("--all-tests", action="store_true", help=ALL_TESTS_HELP)
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("run", parents=[common, prune],
                       help="select, run the selection riskiest first, store evidence",
                       description="Select against the working tree, run the selected tests "
                                   "through pytest in risk order, store fresh evidence for "
                                   "HEAD. Arguments after -- go to pytest.")
    p.add_argument("--base", default=None, help="revision with evidence (as for select)")
    p.add_argument("--all", action="store_true",
                   help="run every test (still in risk order) and refresh all evidence")
    p.add_argument("--json", metavar="FILE", help="also write the run report as JSON")
    p.add_argument("--no-background", action="store_true",
                   help="run only the blocking dimensions (skip convergence, perf, ...)")
    p.add_argument("--all-tests", action="store_true", help=ALL_TESTS_HELP)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("explain", parents=[common, prune], help="why a test is selected or skipped",
                       description="Print a test's decision, its reasons and its evidence.")
    p.add_argument("test_id", help="a pytest node id (a unique prefix is enough)")
    p.add_argument("--base", default=None)
    p.add_argument("--head", default=None)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="the whole loop on the bundled LLM training framework",
                       description="Copy examples/tinyllm into a temporary git repository, "
                                   "record evidence, apply each bundled change and run FastCI "
                                   "on it; print a table and write an HTML report.")
    p.add_argument("--workdir", default=None, help="where to build the demo repository "
                   "(default: a new temporary folder)")
    p.add_argument("--out", default=None, help="HTML report path (default: in the workdir)")
    p.add_argument("--jobs", type=int, default=2,
                   help="changes run at the same time (default 2: the suite pins one thread)")
    p.add_argument("--only", action="append", metavar="CHANGE",
                   help="run only this bundled change (repeatable)")
    p.add_argument("--app", action="store_true",
                   help="the GitHub App loop instead: webhook service, worker, Redis and a "
                        "local fake of GitHub, on one pull request of tinyllm")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("serve", help="the GitHub App's webhook service (gunicorn)",
                       description="Serve POST /webhooks, GET /healthz and GET /metrics. "
                                   "Settings come from FASTCI_* variables (README, App).")
    p.add_argument("--bind", default="127.0.0.1:8000")
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="an RQ worker: selection (--cpu) or one GPU's tests",
                       description="Run jobs from Redis without forking per job. --gpu N pins "
                                   "CUDA_VISIBLE_DEVICES=N and takes that GPU's shards, then "
                                   "background shards; --cpu takes the advances of runs in "
                                   "flight (a shard ended), then selection.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", type=int, default=None, metavar="N")
    where.add_argument("--cpu", action="store_true")
    p.add_argument("--burst", action="store_true", help="stop when the queues are empty")
    p.add_argument("--name", default=None, help="worker name (default: RQ's)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("audit", parents=[common],
                       help="what the selection would have missed, from shadow and full runs",
                       description="Escaped failures, GPU-hours saved and time to the first "
                                   "failure over the audited runs (mode = \"shadow\", or "
                                   "`fastci run --all`). Exits 1 if any failure escaped.")
    p.add_argument("--since-days", type=float, default=None, metavar="N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("gc", parents=[common],
                       help="delete evidence no branch or recent run needs",
                       description="Keep the snapshots of the last --keep-days days and the "
                                   "newest of each branch (local and remote-tracking) and "
                                   "environment however old; delete the other snapshots and "
                                   "the trees, evidence, captures, replays and inventories "
                                   "no kept snapshot reaches. Safe while others write.")
    p.add_argument("--keep-days", type=float, default=None, metavar="N",
                   help="days of snapshots to keep (default: [tool.fastci] retention_days, "
                        "30)")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be deleted (counts and bytes), delete nothing")
    p.add_argument("--json", action="store_true", help="the counts as JSON")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("watchdog", help="conclude stale check runs; redeliver failed webhooks",
                       description="Every --interval seconds: conclude FastCI check runs left "
                                   "in progress past their deadline, and ask GitHub to "
                                   "redeliver deliveries that failed before reaching the queue.")
    p.add_argument("--interval", type=float, default=30.0)
    p.add_argument("--once", action="store_true", help="one cycle, then exit")
    p.set_defaults(func=cmd_watchdog)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = _split_pytest_args(argv)
    parser = build_parser()
    args = parser.parse_args(ours)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    if pytest_args and args.command not in RUNS_PYTEST:
        parser.error(f"`fastci {args.command}` runs no pytest, so it takes no arguments after "
                     f"`--` (got: {' '.join(pytest_args)}); only {', '.join(RUNS_PYTEST)} do")
    try:
        return args.func(args, pytest_args) if args.command in RUNS_PYTEST else args.func(args)
    except FastCIError as exc:  # raised on purpose: the message is for the user
        print(f"fastci: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("fastci: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug of ours: say so plainly, the traceback on request
        if os.environ.get("FASTCI_DEBUG"):
            raise
        print(f"fastci: internal error: {type(exc).__name__}: {exc}\n"
              "This is a FastCI bug; rerun with FASTCI_DEBUG=1 for the traceback and report it.",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
