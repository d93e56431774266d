"""Hardware-aware HPO with NNI's Python API: the HardwareAwareTuner picks MLPs, trials train and report.

    python examples/nni/run_hpo.py --max-trials 5            # prints the trials and the tuner's counts

The experiment uses NNI's local training service and the search space of ``search_space.json``; the tuner
predicts each candidate's A100 latency and skips those whose latency plus one σ is over the budget before they
cost a trial.
NNI's manager listens on 127.0.0.1 only (dippm_nas.nni.loopback_only; NNI itself would bind every
interface, see README.md) on a free port, and is stopped in a ``finally`` block whatever happens.
``config.yml`` is the same experiment for ``nnictl``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from nni.experiment import CustomAlgorithmConfig, Experiment, ExperimentConfig

from dippm_nas.nni import free_port, loopback_only
from dippm_nas.nni import STATS_FILE_NAME

HERE = Path(__file__).resolve().parent
#: The tuner's class args; config.yml holds the same (a test checks they agree).
TUNER_ARGS: dict[str, Any] = {
    "builder": "mlp",
    "base_config": {"in_features": 32, "out_features": 4},
    "objectives": ["accuracy", "latency_ms"],
    "directions": ["maximize", "minimize"],
    "batch_size": 32,
    "dtype": "float16",
    "device": "a100-sxm4-40gb",
    "budgets": {"latency_ms": 0.25},
    # the server the MLPs will run on: a 3.3 GHz PyTorch 2.x host, the input already on the GPU (an undescribed
    # deployment's σ spans real servers, which a 0.25 ms budget of a host-bound MLP cannot hold)
    "deployment": {"host": {"format": 1, "name": "3.3 GHz host", "speed": 1.1, "framework": "torch-2"},
                   "framework": "torch-2", "input_copy": "none"},
    "sampler": "nsga2",
    "population_size": 4,
    "seed": 0,
}
MAX_TRIALS = 5


def build_config(max_trials: int = MAX_TRIALS, concurrency: int = 1,
                 workdir: str | Path | None = None) -> ExperimentConfig:
    """The experiment config: local training service, at most ``max_trials`` (1..5) trials."""
    if not 1 <= max_trials <= MAX_TRIALS:
        raise ValueError(f"max_trials must be in 1..{MAX_TRIALS}, got {max_trials}")
    config = ExperimentConfig("local")
    config.experiment_name = "dippm-nas-hpo-mlp"
    config.search_space = json.loads((HERE / "search_space.json").read_text())
    config.trial_command = f"{shlex.quote(sys.executable)} trial.py"
    config.trial_code_directory = HERE
    config.trial_concurrency = concurrency
    config.max_trial_number = max_trials
    config.max_experiment_duration = "15m"
    config.tuner = CustomAlgorithmConfig(class_name="dippm_nas.nni.HardwareAwareTuner", code_directory=HERE,
                                         class_args=dict(TUNER_ARGS))
    config.training_service.use_active_gpu = False
    if workdir is not None:
        config.experiment_working_directory = str(workdir)
    return config


def run(max_trials: int = MAX_TRIALS, *, port: int | None = None, concurrency: int = 1,
        workdir: str | Path | None = None, timeout_s: float = 900.0) -> dict[str, Any]:
    """Run the experiment to its end and stop NNI; returns status, trial results and tuner counts."""
    config = build_config(max_trials, concurrency, workdir)
    exp = Experiment(config)
    port = free_port() if port is None else port
    status = "NOT_STARTED"
    try:
        with loopback_only():
            exp.start(port)
        deadline = time.monotonic() + timeout_s
        while True:
            status = exp.get_status()
            if status in ("DONE", "ERROR", "STOPPED"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"experiment {exp.id} still {status} after {timeout_s:.0f} s")
            time.sleep(0.5)
        trials = [{"parameter": r.parameter, "value": r.value, "trial_job_id": r.trialJobId}
                  for r in exp.export_data()]
        jobs = [{"id": j.trialJobId, "status": j.status} for j in exp.list_trial_jobs()]
    finally:
        exp.stop()
    log_dir = Path(config.canonical_copy().experiment_working_directory) / exp.id / "log"
    stats_path = log_dir / STATS_FILE_NAME
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else None
    return {"experiment_id": exp.id, "port": port, "status": status, "trials": trials, "jobs": jobs,
            "tuner_stats": stats, "log_dir": str(log_dir)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-trials", type=int, default=MAX_TRIALS, help="trials to run, 1..5")
    ap.add_argument("--concurrency", type=int, default=1, help="trials at once")
    ap.add_argument("--port", type=int, default=None, help="NNI manager port (default: a free one)")
    ap.add_argument("--workdir", default=None, help="NNI experiment directory (default ~/nni-experiments)")
    ap.add_argument("--json", action="store_true", help="print the whole result as one JSON document")
    args = ap.parse_args(argv)
    out = run(args.max_trials, port=args.port, concurrency=args.concurrency, workdir=args.workdir)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"experiment {out['experiment_id']}: {out['status']} (logs in {out['log_dir']})")
        for t in out["trials"]:
            v, p = t["value"], t["parameter"]
            print(f"  hidden={p['hidden']} activation={p['activation']} lr={p['lr']:.4g}: "
                  f"accuracy={v['accuracy']:.3f} predicted latency={v['latency_ms']:.3f} ms "
                  f"memory={v['memory_mib']:.0f} MiB mig={v['mig']} default={v['default']:.3f} ({v['source']})")
        print(f"tuner: {out['tuner_stats']}")
    return 0 if out["status"] == "DONE" else 1


if __name__ == "__main__":
    sys.exit(main())
