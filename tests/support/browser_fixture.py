"""Fixtures for driving JupyterLab in headless Chromium: the browser binary and a JupyterLab server.

`chromium` gives the path of the system Chromium (apt-get installing it when missing and root), and
`jupyter_lab` starts a JupyterLab server on 127.0.0.1 and a free port, with its own token, root dir
and settings, and stops exactly that server (by its PID) at the end.  Where no browser can be had the
tests are skipped, except with CI=true, where they fail: CI must run them.  Facts behind the
settings: /work/shared/notes/browser.md (never `playwright install`; it downloads a browser).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .exclusive import held

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
APT_UPDATE_TIMEOUT_S = 300
APT_INSTALL_TIMEOUT_S = 600
SERVER_START_TIMEOUT_S = 90

# JupyterLab user settings for the test server: every cell in the DOM (no windowing), no news toast.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


def unavailable(reason: str) -> None:
    """Skip the test, or fail it when CI=true (CI must run the browser tests)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but the browser test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def _apt(args: list[str], timeout_s: float) -> str | None:
    """Run apt-get with a hard time limit; None on success, else why it failed."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        proc = subprocess.run(["apt-get", *args], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"'apt-get {' '.join(args)}' did not finish within {timeout_s:.0f} s"
    except OSError as exc:
        return f"'apt-get {' '.join(args)}' could not run: {exc}"
    if proc.returncode != 0:
        return f"'apt-get {' '.join(args)}' exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[-800:]}"
    return None


def ensure_chromium() -> tuple[Path | None, str]:
    """The Chromium binary (apt-get installing it if missing and root), or None and why not."""
    if CHROMIUM.exists():
        return CHROMIUM, ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, f"{CHROMIUM} is missing and cannot be installed here (apt-get install chromium needs root)"
    with held("apt"):  # the SLURM fixture may be installing its packages from another worker
        if CHROMIUM.exists():
            return CHROMIUM, ""
        problem = _apt(["update"], APT_UPDATE_TIMEOUT_S) or _apt(["install", "-y", "chromium"], APT_INSTALL_TIMEOUT_S)
    if problem:
        return None, f"installing Chromium failed: {problem}"
    if not CHROMIUM.exists():
        return None, f"apt-get install chromium finished but {CHROMIUM} is still missing"
    return CHROMIUM, ""


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Path of the system Chromium for Playwright's executable_path (with playwright importable)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("the playwright Python package is not installed (pip install playwright; "
                    "do not run `playwright install`)")
    path, reason = ensure_chromium()
    if path is None:
        unavailable(reason)
    return path


@dataclass
class JupyterLab:
    root: Path
    token: str
    process: subprocess.Popen
    log: Path
    runtime: Path
    """The server's own JUPYTER_RUNTIME_DIR: its jpserver-PID.json names the port it listens on."""
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        """The notebook in a workspace of its own: the tabs another test opened on this (shared)
        server are not restored beside it (their cells would match the test's locators)."""
        return f"{self.base_url}/lab/workspaces/t{secrets.token_hex(6)}/tree/{notebook}?token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def listening_port(self) -> int:
        """The port the server says it listens on (0 until it has written its server info file,
        which it does once its socket is bound)."""
        try:
            info = json.loads((self.runtime / f"jpserver-{self.process.pid}.json").read_text())
        except (OSError, ValueError):
            return 0
        port = info.get("port") if isinstance(info, dict) else None
        return port if type(port) is int and 0 < port < 65536 else 0

    def answers(self) -> bool:
        self.port = self.port or self.listening_port()
        if not self.port:
            return False
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/status?token={self.token}", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            return False

    def wait_ready(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.3)

    def _api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"{self.base_url}/api/{path}?token={self.token}", method=method)
        with urllib.request.urlopen(request, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Shut down every kernel of this server (what a test left running), through its API."""
        for kernel in self._api("kernels"):
            try:
                self._api(f"kernels/{kernel['id']}", method="DELETE")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # gone meanwhile: fine
                    raise

    def stop(self) -> None:
        """Shut the server down (its kernels first) through its API, then make sure its PID is gone."""
        if self.process.poll() is None and self.port:
            try:
                request = urllib.request.Request(f"{self.base_url}/api/shutdown?token={self.token}", method="POST")
                urllib.request.urlopen(request, timeout=10).close()
            except (urllib.error.URLError, OSError):
                pass
        for sig, wait_s in ((None, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if sig is not None and self.process.poll() is None:
                os.kill(self.process.pid, sig)  # only the server this fixture started
            try:
                self.process.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def start_jupyter_lab(root: Path, env: dict[str, str] | None = None) -> JupyterLab:
    """Start `jupyter lab` serving `root` on 127.0.0.1; returns once it answers.  The server binds
    a port the kernel picks (`--port 0`) and names it in its server info file, in a runtime folder
    of its own: a port picked here and released would be free for anyone (a rank's store in the
    other worker took one once, and its binary answer was read as the server's)."""
    token = secrets.token_hex(16)
    settings = root.parent / f"{root.name}-lab-settings"
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    workspaces = root.parent / f"{root.name}-lab-workspaces"
    workspaces.mkdir(exist_ok=True)
    runtime = root.parent / f"{root.name}-lab-runtime"
    runtime.mkdir(exist_ok=True)
    server_env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
                  "JUPYTERLAB_WORKSPACES_DIR": str(workspaces), "JUPYTER_RUNTIME_DIR": str(runtime),
                  **(env or {})}
    server_env.pop("MPLBACKEND", None)
    log = root.parent / f"{root.name}-jupyter-lab.log"
    last_error: Exception | None = None
    for _attempt in range(3):  # the server checks port 0's pick and binds it again: it can lose it between
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", "--port", "0",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               "--allow-root"]
        with open(log, "ab") as out:
            process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=root, env=server_env)
        lab = JupyterLab(root, token, process, log, runtime)
        try:
            lab.wait_ready()
            return lab
        except RuntimeError as exc:
            last_error = exc
            lab.stop()
    raise RuntimeError(f"jupyter lab could not start: {last_error}")


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    """One JupyterLab server for the session (registered once, in tests/browser/conftest.py: a test
    module that imports it would get a server of its own); its root is a fresh folder, runs go under
    lab/runs.  Each test writes its own notebook there; its kernels are shut down after it."""
    root = tmp_path_factory.mktemp("jupyter") / "lab"
    root.mkdir()
    lab = start_jupyter_lab(root, {"WORKBENCH_RUN_ROOT": str(root / "runs")})
    try:
        yield lab
    finally:
        lab.stop()


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
"""Screenshots the browser tests leave for a person to look at."""


def wait_kernel_idle(page, timeout_ms: int) -> None:
    """The notebook's kernel (named by its metadata, started by JupyterLab) is connected and idle."""
    from playwright.sync_api import expect

    expect(page.locator("#jp-main-statusbar")).to_contain_text(re.compile(r"Python 3.*\|\s*Idle"),
                                                               timeout=timeout_ms)


def run_all_cells(page) -> None:
    """Run > Run All Cells from JupyterLab's menu bar (accepting a kernel dialog, should one appear)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.wait_for(timeout=2_000)
    except Exception:  # noqa: BLE001 - no dialog: the usual case
        return
    dialog.locator(".jp-mod-accept").click()  # "Select" the notebook's own kernel (python3)


def form_field(app, name: str):
    """The text input of the Workbench form's field labelled `name`, inside the output `app`."""
    label = app.page.locator("label.widget-label", has_text=re.compile(rf"^{name}$"))  # relative: `has=` asks it
    return app.locator(".widget-text").filter(has=label).locator("input")


def commit_text(field, text: str, delay_ms: int = 60) -> None:
    """Type `text` over the field's value key by key, as a person does, then leave the field (Tab)."""
    field.click()
    field.press("Control+a")
    field.press_sequentially(text, delay=delay_ms)
    field.press("Tab")
