"""The same small sweep with the local executor and on Ray (1 actor, then 2), one thread each.

Prints one line per executor and, last, one JSON line:
``ratio_wall_ray1_vs_local`` (goal <= 1.10: Ray's overhead is small) and
``ratio_wall_ray2_vs_ray1`` (what a second actor on a second core gives). Every wall time
includes loading the model (each Ray actor loads its own); Ray's own start-up is timed apart.

    .venv/bin/python benchmarks/bench_sweep.py [--limit 6] [--subjects anatomy ...]
"""

import argparse
import json
import os
import tempfile
import time

from inactive_heads.core.versions import library_versions

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--subjects", nargs="+", default=["abstract_algebra", "anatomy"])
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()

    import ray
    import torch

    from inactive_heads.sweep.run import run_sweep
    from inactive_heads.sweep.config import SweepConfig

    torch.set_num_threads(1)
    config = SweepConfig(model=args.model, task="mmlu", subjects=args.subjects, limit=args.limit, num_fewshot=0,
                         scores=["ahon_ln", "awft"], quantiles=[0.1, 0.3], batch_size=args.batch_size)
    walls, records = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        res = run_sweep(config, f"{tmp}/local", progress=False)
        walls["local"] = time.perf_counter() - start
        records["local"] = res.records
        print(f"local: {walls['local']:.1f} s")
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray_init = time.perf_counter() - start
        for workers in (1, 2):
            name = f"ray{workers}"
            start = time.perf_counter()
            res = run_sweep(config, f"{tmp}/{name}", executor="ray", workers=workers, threads_per_worker=1,
                            progress=False)
            walls[name] = time.perf_counter() - start
            records[name] = res.records
            print(f"{name}: {walls[name]:.1f} s")
        ray.shutdown()

    def stable(recs):
        return {k: r.without_volatile() for k, r in recs.items()}

    identical = stable(records["local"]) == stable(records["ray1"]) == stable(records["ray2"])
    n_runs = len(records["local"])
    print(json.dumps({
        **library_versions(),
        "bench": "bench_sweep", "model": args.model, "questions": records["local"]["baseline"].n,
        "runs": n_runs, "threads_per_worker": 1, "cpu_count": os.cpu_count(),
        "wall_s_local": round(walls["local"], 2), "wall_s_ray1": round(walls["ray1"], 2),
        "wall_s_ray2": round(walls["ray2"], 2), "ray_init_s": round(ray_init, 2),
        "ratio_wall_ray1_vs_local": round(walls["ray1"] / walls["local"], 3),
        "ratio_wall_ray2_vs_ray1": round(walls["ray2"] / walls["ray1"], 3),
        "records_identical": identical,
    }))


if __name__ == "__main__":
    main()
