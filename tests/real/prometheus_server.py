"""Run the real Prometheus (Debian's package) on a free port, scraping the given targets."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port, require_real, wait_until_healthy


@contextmanager
def running_prometheus(
    workdir: Path,
    jobs: dict[str, list[str]],
    interval: str,
    scrape_configs: Sequence[dict[str, Any]] = (),
) -> Iterator[str]:
    """Yield the base URL of a Prometheus scraping each job's `host:port` targets every
    `interval` (and the further `scrape_configs` given whole); stop it afterwards."""
    binary = shutil.which("prometheus")
    if binary is None:
        require_real("no prometheus binary (apt-get install prometheus; scripts/setup does it)")
    assert binary is not None
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": interval, "scrape_timeout": interval},
                "scrape_configs": [
                    *(
                        {"job_name": job, "static_configs": [{"targets": targets}]}
                        for job, targets in jobs.items()
                    ),
                    *scrape_configs,
                ],
            }
        )
    )
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, f"{url}/-/ready", 60, lambda: log_path.read_text())
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
