// Drive a real JupyterLab with Debian's Chromium (playwright-core, executablePath: no browser
// download) for scripts/lab_screenshots.py. Usage:
//   node lab_screenshots.mjs live  URL OUT_DIR   run every cell of a training notebook, screenshot the
//                                                live view with its group of samples, click Stop
//   node lab_screenshots.mjs view  URL OUT_DIR   screenshot an executed notebook, reopened
import { chromium } from "playwright-core";

const [mode, url, out] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"] });
const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
const log = (m) => console.log(`[lab_screenshots] ${m}`);
await page.goto(url, { waitUntil: "domcontentloaded", timeout: 180000 });
await page.waitForSelector(".jp-Notebook", { timeout: 180000 });
await page.waitForTimeout(3000);

if (mode === "live") {
  // wait for the kernel, then Run > Run All Cells through the app's command registry
  await page.waitForFunction(() => window.jupyterapp && document.querySelector(".jp-Notebook-ExecutionIndicator, .jp-Toolbar"),
    null, { timeout: 180000 });
  await page.waitForTimeout(8000);
  await page.evaluate(() => window.jupyterapp.commands.execute("notebook:run-all-cells"));
  log("run all cells");
  const stop = page.locator("button", { hasText: "Stop (checkpoint first)" });
  try {
    await stop.waitFor({ timeout: 300000 });
    await page.locator(".rft-group").first().waitFor({ timeout: 300000 });
  } catch (e) {
    await page.screenshot({ path: `${out}/live_debug.png` });
    throw e;
  }
  await page.waitForTimeout(1500);
  const panel = page.locator(".widget-vbox", { has: stop }).first();
  await panel.scrollIntoViewIfNeeded();
  await page.screenshot({ path: `${out}/live_view.png`, fullPage: false });
  await panel.screenshot({ path: `${out}/live_view_panel.png` });
  log("live view captured; clicking Stop");
  await stop.click();
  await page.locator("button.widget-button", { hasText: "Stopping after this step" })
    .waitFor({ timeout: 120000 }).then(() => log("Stop acknowledged while the cell runs"))
    .catch(() => log("Stop not acknowledged within 120 s"));
  await panel.screenshot({ path: `${out}/live_view_stopping.png` });
  // the trainer of this branch may not check control/stop yet: interrupt the kernel to end the demo
  await page.waitForTimeout(5000);
  await page.evaluate(() => window.jupyterapp.commands.execute("notebook:interrupt-kernel"));
  log("kernel interrupted");
  // let the run end (the cell's idle prompt) before closing
  await page.waitForFunction(() => !document.querySelector(".jp-InputArea-prompt") ||
    ![...document.querySelectorAll(".jp-InputArea-prompt")].some(e => e.textContent.includes("[*]")),
    null, { timeout: 600000 }).catch(() => log("cells still running at timeout"));
  await panel.screenshot({ path: `${out}/live_view_end.png` });
} else {
  await page.waitForTimeout(2000);
  await page.screenshot({ path: `${out}/executed_top.png` });
  const img = page.locator(".jp-RenderedImage img").first();
  await img.scrollIntoViewIfNeeded();
  await page.waitForTimeout(800);
  await page.screenshot({ path: `${out}/executed_plot.png` });
}
await browser.close();
