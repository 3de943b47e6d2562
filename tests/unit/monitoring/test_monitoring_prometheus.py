"""monitoring/prometheus.yml and the command that runs it: Ray's discovery file, loopback."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring.prometheus import CONFIG, config_for, discovery_file, main, prometheus_argv


def test_the_shipped_config_scrapes_the_latest_ray_sessions_discovery_file():
    config = yaml.safe_load(CONFIG.read_text())
    (job,) = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == [str(discovery_file())]
    assert discovery_file() == Path("/tmp/ray/session_latest/prom_metrics_service_discovery.json")


def test_config_for_another_ray_temp_dir_and_interval():
    config = config_for(Path("/tmp/rm1/ray"), scrape_interval_s=2)
    (job,) = config["scrape_configs"]
    assert job["file_sd_configs"][0]["files"] == [
        "/tmp/rm1/ray/session_latest/prom_metrics_service_discovery.json"
    ]
    assert config["global"]["scrape_interval"] == "2s"
    # The shipped file is not changed by it.
    assert yaml.safe_load(CONFIG.read_text())["global"]["scrape_interval"] == "5s"


def test_prometheus_listens_on_loopback_only(tmp_path):
    argv = prometheus_argv("/usr/bin/prometheus", tmp_path / "p.yml", tmp_path / "data", 9191)
    assert "--web.listen-address=127.0.0.1:9191" in argv
    assert not any("0.0.0.0" in arg for arg in argv)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus not installed")
@pytest.mark.parametrize("ray_temp", [None, Path("/tmp/rm9/ray")])
def test_promtool_accepts_the_config(tmp_path, ray_temp):
    config = yaml.safe_load(CONFIG.read_text()) if ray_temp is None else config_for(ray_temp)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_without_prometheus_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main([]) == 1
    assert "apt-get install -y prometheus" in capsys.readouterr().err
