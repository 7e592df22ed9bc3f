"""`python -m bench`: run the benchmark suite and write BENCHMARKS.md plus JSON results.

Each section writes its own JSON file as soon as it finishes, so a run can be resumed
(`--resume` skips sections whose result exists with the same parameters) or narrowed
(`--only query,peers`). The report is rebuilt from every result file present.
`--only tf_load [--duration S] [--before PYTHON]` is issue 16's TF-load benchmark
(bench/tf_load.py); `--only footprint --before PYTHON` also measures another checkout's
start-up on the same stores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    machine_info,
    parse_scale,
    read_json,
    scale_label,
    write_json,
)

SEMANTIC_SETS = "separated,overlap,minilm"  # the three sets of the semantic-only bars
SECTIONS = ("limit", "embed", "query", "prototypes", "save", "ingest", "footprint", "peers",
            "ros", "index", "tf_load", "semantic")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true",
                   help="smoke scale: 2k rows, few queries, no peers (seconds, not minutes)")
    p.add_argument("--scales", default=None, help="row counts, e.g. 10k,100k,1M")
    p.add_argument("--vectors", default="auto", choices=("auto", "synthetic", "minilm",
                                                         "overlap", "separated"),
                   help="auto: MiniLM text embeddings up to 100k rows, synthetic above; "
                   "overlap: synthetic clusters that overlap (harder for the graph)")
    p.add_argument("--only", default=None, help=f"comma list of sections: {','.join(SECTIONS)}")
    p.add_argument("--skip", default="", help="comma list of sections to leave out")
    p.add_argument("--queries", type=int, default=None, help="queries per kind (default 300)")
    p.add_argument("--peers", default=None,
                   help="comma list of peers (sqlite-vec,chroma,milvus-lite,memsearch)")
    p.add_argument("--peer-scales", default="100k", help="scales the peers run at")
    p.add_argument("--sets", default=SEMANTIC_SETS,
                   help="semantic: vector sets side by side (separated: well-separated "
                   "clusters, overlap: overlapping clusters, minilm: MiniLM captions; "
                   "synthetic: clusters on a 32-d manifold, the 1M set above)")
    p.add_argument("--build-watch", default="separated",
                   help="semantic: the set whose graph build from nothing is watched ('none': "
                   "no build watched)")
    p.add_argument("--rebuild-max", default="100k",
                   help="largest scale whose start-up rebuild is re-measured (the figure from "
                   "the store's build is reported above it)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=None,
                   help="tf_load: seconds of load per configuration (default 120; 15 quick)")
    p.add_argument("--before", metavar="PYTHON", default=None,
                   help="tf_load, footprint: also run the node (the engine) of another "
                   "checkout through its interpreter, e.g. ../wt-before/.venv/bin/python (the "
                   "code before a fix)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="results directory")
    p.add_argument("--report", type=Path, default=None,
                   help="report path (default BENCHMARKS.md at the repository root)")
    p.add_argument("--resume", action="store_true",
                   help="skip sections whose result file exists with the same parameters, "
                   "and reuse peers' raw answers from an earlier run on the same data")
    return p.parse_args(argv)


def vectors_for(n: int, choice: str, quick: bool) -> str:
    if choice != "auto":
        return choice
    return "minilm" if (not quick and n <= 100_000) else "synthetic"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    scales = [parse_scale(s) for s in (args.scales or ("2k" if quick else "10k,100k,1M"))
              .split(",")]
    nq = args.queries or (20 if quick else 300)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    only -= set(filter(None, args.skip.split(",")))
    unknown = only - set(SECTIONS)
    if unknown:
        print(f"unknown section(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if quick and args.peers is None and not args.only:
        only.discard("peers")
    peers = (args.peers or "sqlite-vec,chroma,milvus-lite,memsearch").split(",")
    peer_scales = [parse_scale(s) for s in args.peer_scales.split(",")]
    out: Path = args.out
    raw = out / "raw"
    scratch = out / "raw" / "scratch"
    raw.mkdir(parents=True, exist_ok=True)
    report = args.report or (REPO_ROOT / "BENCHMARKS.md")
    run_info = {"argv": ["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])],
                "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine_info(),
                "quick": quick}
    write_json(out / "run.json", run_info)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from bench import engine_bench as eb

    def run(name: str, params: dict[str, Any], fn: Any) -> None:
        path = out / f"{name}.json"
        if args.resume and path.exists():
            try:
                old = read_json(path)
                if old.get("params") == params and "error" not in old:
                    log(f"[{name}] kept from an earlier run")
                    return
            except ValueError:
                pass
        log(f"[{name}] ...")
        t0 = time.perf_counter()
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            import traceback

            traceback.print_exc()
            res = {"error": f"{type(exc).__name__}: {exc}"}
        res["params"] = params
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        write_json(path, res)
        log(f"[{name}] {res['wall_s']} s")

    if "limit" in only:
        mib, reps = (64, 3) if quick else (512, 7)
        run("limit", {"mib": mib}, lambda: eb.section_limit(log, mib, reps))
    if "embed" in only:
        run("embed", {"nq": nq}, lambda: eb.section_embed(min(nq, 200), log))
    for n in scales:
        v = vectors_for(n, args.vectors, quick)
        # Results of other vectors than the default at this scale are kept beside its own.
        lab = scale_label(n) + ("" if v == vectors_for(n, "auto", quick) else f"_{v}")
        base = {"n": n, "vectors": v, "seed": args.seed}
        # Fewer queries above 100k: a pass over every kind must stay within minutes there.
        qn = nq if n <= 100_000 else min(nq, 50)
        if "query" in only:
            run(f"query_{lab}", {**base, "nq": qn},
                lambda n=n, v=v, qn=qn: eb.section_query(n, args.seed, v, qn, raw, log))
        if "prototypes" in only:
            pq = min(qn, 100)
            qres = out / f"query_{lab}.json"
            before = None
            if n > 100_000 and qres.exists():  # the slow path is not re-measured at 1M
                qr = read_json(qres)
                if qr.get("params", {}).get("nq") == pq and "kinds" in qr:
                    before = qr["kinds"]
            run(f"prototypes_{lab}", {**base, "nq": pq},
                lambda n=n, v=v, pq=pq, before=before: eb.section_prototypes(
                    n, args.seed, v, pq, log, before))
        if "index" in only:
            from bench import index_bench

            run(f"index_{lab}", {**base, "nq": min(qn, 200)},
                lambda n=n, v=v, qn=qn: index_bench.section_index(
                    n, args.seed, v, min(qn, 200), scratch, log))
        if "footprint" in only:
            rmax = parse_scale(args.rebuild_max)
            run(f"footprint_{lab}", {**base, "rebuild_measured": n <= rmax,
                                     "before": bool(args.before)},
                lambda n=n, v=v, rmax=rmax: eb.section_footprint(n, args.seed, v, log, rmax,
                                                                 args.before))
    save_n = max([n for n in scales if n <= 100_000] or [min(scales)])
    if "save" in only:
        v = vectors_for(save_n, args.vectors, quick)
        nsaves, sustain = (10, 1.0) if quick else (200, 10.0)
        run("save", {"n": save_n, "vectors": v, "nsaves": nsaves},
            lambda: eb.section_save(save_n, args.seed, v, nsaves, sustain, scratch, log))
    if "ingest" in only:
        rates, secs = ([1.0], 2.0) if quick else ([1.0, 2.0, 5.0], 20.0)
        def ingest() -> dict[str, Any]:
            res = eb.section_ingest(rates, secs, scratch, log)
            if quick:
                res["ros"] = {"skipped": "not in --quick (node start-up and bag replay)"}
                return res
            try:
                from bench.ros_bench import section_ros_ingest

                res["ros"] = section_ros_ingest(rates, 60.0, scratch, log)
            except Exception as exc:  # noqa: BLE001 - keep the engine-level figures
                res["ros"] = {"error": f"{type(exc).__name__}: {exc}"}
            return res

        run("ingest", {"rates": rates, "seconds": secs}, ingest)
    if "peers" in only:
        from bench.peers import section_peers

        for n in peer_scales:
            v = vectors_for(n, args.vectors, quick)
            pq = min(nq, 200)
            run(f"peers_{scale_label(n)}", {"n": n, "vectors": v, "nq": pq, "peers": peers},
                lambda n=n, v=v, pq=pq: section_peers(n, args.seed, v, pq, peers, raw, log,
                                                      reuse_raw=args.resume))
    # Only when asked for by name (--only semantic): three stores per scale, MiniLM at 1M
    # would embed a million texts.
    if "semantic" in only and not quick and args.only and "semantic" in args.only.split(","):
        from bench.semantic_bench import section_semantic

        sets = args.sets.split(",")
        for n in scales:
            sq = nq  # 100 queries measure recall@5 to +-0.005: too coarse for a 0.99 bar
            tag = "" if args.sets == SEMANTIC_SETS else "_" + "_".join(sets)
            run(f"semantic_{scale_label(n)}{tag}", {"n": n, "sets": sets, "nq": sq,
                                              "peers": "chroma" in peers},
                lambda n=n, sq=sq: section_semantic(n, args.seed, sets, sq, raw, log,
                                                    peers="chroma" in peers,
                                                    watch=args.build_watch))
    if "ros" in only:
        from bench.ros_bench import section_ros

        n = save_n
        v = vectors_for(n, args.vectors, quick)
        rq = min(nq, 100)
        run("ros", {"n": n, "vectors": v, "nq": rq},
            lambda: section_ros(n, args.seed, v, rq, log))
    if "tf_load" in only:
        from bench.tf_load import section_tf_load

        dur = args.duration or (15.0 if quick else 120.0)
        rates = [1.0] if quick else [1.0, 2.0, 4.0]
        cmd = " ".join(run_info["argv"])

        def tf_load() -> dict[str, Any]:
            res = section_tf_load(dur, log, args.before, rates, 30.0 if quick else 60.0,
                                  camera_size=(320, 240))
            res["command"] = cmd
            return res

        run("tf_load", {"duration_s": dur, "before": bool(args.before), "rates": rates,
                        "camera": "320x240"}, tf_load)
    eb.cleanup_scratch(scratch)
    from bench.report import write_report

    write_report(out, report)
    log(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
