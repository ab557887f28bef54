"""The host's part of docs/deploy.md, cheaply: ``deploy/podman-limits.sh`` writes podman's default ulimits
within this host's hard limits once, and refuses in one line (exit 2) a file it cannot add them to;
``deploy/base_images.py`` refuses in one line (exit 2) where podman is missing. ``make test-deploy`` runs
both as the docs write them, on this machine's real podman."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
LIMITS = PROJECT / "deploy" / "podman-limits.sh"


def _limits(conf: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(conf.parent), "CONTAINERS_CONF": str(conf)}
    return subprocess.run([str(LIMITS)], capture_output=True, text=True, env=env, check=False)


def test_podman_limits_are_the_hosts_hard_limits_written_once(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine]\nlock_type = "file"\n')
    first = _limits(conf)
    assert first.returncode == 0, first.stderr
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    want_nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    want_nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    written = conf.read_text()
    assert (
        f'default_ulimits = ["nofile={want_nofile}:{want_nofile}", "nproc={want_nproc}:{want_nproc}"]'
        in written
    )
    assert written.startswith('[engine]\nlock_type = "file"\n') and written.count("[containers]") == 1
    again = _limits(conf)
    assert again.returncode == 0 and conf.read_text() == written and "left as it is" in again.stdout


def test_podman_limits_refuse_a_containers_table_in_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\nlog_driver = "k8s-file"\n')
    done = _limits(conf)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.match(rf"error: {re.escape(str(conf))}: has a \[containers\] table", done.stderr)
    assert conf.read_text() == '[containers]\nlog_driver = "k8s-file"\n'  # nothing half-written


def test_base_images_refuse_without_podman_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(PROJECT / "deploy" / "base_images.py")],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},  # no podman on it
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2 and done.stderr == "error: podman: not installed (apt-get install podman)\n"
