"""The plan explorer in a real browser: JupyterLab on localhost, 01_plan_explorer.ipynb opened in
headless Chromium (Debian's `chromium`, driven by Playwright; no browser download), Run All,
then a control changed and Plan clicked: the widget renders, the old result goes, the button is
disabled while planning, and the new allocation figure appears. Screenshots of each step are kept
in out/browser/ (HEXISEQ_BROWSER_ARTIFACTS overrides).

Run with `make test-browser` (it sets HEXISEQ_BROWSER_TEST=1); `make test` skips it, saying so.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("HEXISEQ_BROWSER_TEST") != "1",
    reason="real-browser test: run `make test-browser` (needs Debian's chromium and playwright)",
)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "01_plan_explorer.ipynb"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("HEXISEQ_BROWSER_ARTIFACTS") or REPO / "out" / "browser")
T_START_S, T_RUN_S, T_PLAN_S = 90, 240, 120  # generous limits on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of the notebook (the browser's autosave
    must not touch the repository's), with its own settings (no news / update pop-ups)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    settings = root / ".settings" / "@jupyterlab"
    for plugin, values in (
        ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
        ("docmanager-extension/plugin", {"autoStartDefaultKernel": True}),
    ):  # no kernel-choice dialog
        (settings / plugin).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces"),
    }
    env.pop("MPLBACKEND", None)
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > T_START_S:
                proc.kill()
                log.close()
                pytest.fail(f"JupyterLab did not start in {T_START_S} s; see {ARTIFACTS / 'jupyterlab.log'}")
            time.sleep(0.5)
    yield url, token
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_plan_explorer_in_chromium(lab):
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), f"no Chromium at {CHROMIUM}: apt-get install chromium (or set CHROMIUM)"
    url, token = lab
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        try:
            page.goto(f"{url}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=T_START_S * 1000)
            dialog = page.get_by_role(
                "button", name="Select", exact=True
            )  # the kernel dialog, should settings not apply
            try:
                dialog.click(timeout=3000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=T_START_S * 1000)
            timings["open"] = time.monotonic() - t0
            page.screenshot(path=str(ARTIFACTS / "1-opened.png"))

            # Run > Run All Cells, as a user would
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            explorer = page.locator(".hexiseq-explorer")
            expect(explorer).to_be_visible(timeout=T_RUN_S * 1000)
            alloc = explorer.locator("img.hexiseq-allocation")
            expect(alloc).to_be_visible(timeout=T_RUN_S * 1000)
            expect(explorer.locator(".hexiseq-result")).to_contain_text(
                "testbed-8 · llama2-7b · 128K tokens: HexiSeq", timeout=30_000
            )
            timings["run all"] = time.monotonic() - t0
            alloc.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "2-run-all.png"), full_page=True)
            tracebacks = page.locator(".jp-OutputArea-output", has_text="Traceback")
            assert tracebacks.count() == 0, tracebacks.first.inner_text()

            # change a control: the old result goes at once
            explorer.locator(".widget-dropdown", has=page.locator("label", has_text="cluster")).locator(
                "select"
            ).select_option("sim-32")
            expect(explorer.locator(".hexiseq-status")).to_contain_text("Settings changed", timeout=10_000)
            expect(alloc).to_have_count(0)
            page.screenshot(path=str(ARTIFACTS / "3-changed.png"))

            # Plan: disabled while planning, elapsed time shown, then the new result and figure
            button = explorer.locator("button.hexiseq-plan-button")
            button.click()
            expect(button).to_be_disabled(timeout=10_000)
            expect(explorer.locator(".hexiseq-status")).to_contain_text("planning", timeout=10_000)
            page.screenshot(path=str(ARTIFACTS / "4-planning.png"))
            expect(explorer.locator(".hexiseq-result")).to_contain_text(
                "sim-32 · llama2-7b · 128K tokens: HexiSeq", timeout=T_PLAN_S * 1000
            )
            expect(alloc).to_be_visible(timeout=30_000)
            expect(button).to_be_enabled()
            assert alloc.evaluate("img => img.complete && img.naturalWidth > 0")
            timings["plan"] = time.monotonic() - t0
            alloc.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "5-planned.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    (ARTIFACTS / "timings.json").write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}) + "\n")
    print(f"browser test: {timings}; screenshots in {ARTIFACTS}")
