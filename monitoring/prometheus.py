"""Run Debian's Prometheus against Ray's metrics export, on loopback.

`python -m monitoring.prometheus` (what `make monitor` runs) starts it in the foreground with
monitoring/prometheus.yml, its data under .cache/prometheus. A Ray started with another temp
dir (RAY_TMPDIR, as the tests do) is scraped by pointing the config at that dir's discovery
file; `prometheus_argv` and `config_for` are what the tests use to start their own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "monitoring" / "prometheus.yml"
DISCOVERY_FILE = "prom_metrics_service_discovery.json"
DEFAULT_RAY_TEMP = Path("/tmp/ray")


def discovery_file(ray_temp_dir: Path = DEFAULT_RAY_TEMP) -> Path:
    """The file the latest Ray session under `ray_temp_dir` lists its metrics agents in."""
    return ray_temp_dir / "session_latest" / DISCOVERY_FILE


def config_for(ray_temp_dir: Path, scrape_interval_s: float | None = None) -> dict:
    """monitoring/prometheus.yml, scraping the Ray session under `ray_temp_dir`."""
    config = yaml.safe_load(CONFIG.read_text())
    (job,) = config["scrape_configs"]
    job["file_sd_configs"][0]["files"] = [str(discovery_file(ray_temp_dir))]
    if scrape_interval_s is not None:
        interval = f"{scrape_interval_s:g}s"
        config["global"]["scrape_interval"] = interval
        job["file_sd_configs"][0]["refresh_interval"] = interval
    return config


def prometheus_argv(binary: str, config_path: Path, data_dir: Path, port: int = 9090) -> list[str]:
    """Prometheus on 127.0.0.1:`port` only, keeping a day of data in `data_dir`."""
    return [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data_dir}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--data-dir", type=Path, default=ROOT / ".cache" / "prometheus")
    parser.add_argument(
        "--ray-temp-dir",
        type=Path,
        default=Path(os.environ["RAY_TMPDIR"]) / "ray"
        if "RAY_TMPDIR" in os.environ
        else DEFAULT_RAY_TEMP,
        help="Ray's temp dir (default: $RAY_TMPDIR/ray, else /tmp/ray)",
    )
    args = parser.parse_args(argv)
    binary = shutil.which("prometheus")
    if binary is None:
        print(
            "Prometheus is not installed: as root, apt-get install -y prometheus "
            "(or `make prometheus`)",
            file=sys.stderr,
        )
        return 1
    args.data_dir.mkdir(parents=True, exist_ok=True)
    config_path = args.data_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config_for(args.ray_temp_dir), sort_keys=False))
    print(
        f"Prometheus on http://127.0.0.1:{args.port}, scraping the Ray session in "
        f"{args.ray_temp_dir}; start the service with "
        f"RAY_PROMETHEUS_HOST=http://127.0.0.1:{args.port} for Ray's dashboard to use it",
        flush=True,
    )
    command = prometheus_argv(binary, config_path, args.data_dir, args.port)
    os.execv(binary, command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
