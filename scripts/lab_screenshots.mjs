// Drive a real JupyterLab with Debian's Chromium (playwright-core, executablePath: no browser
// download) for scripts/lab_screenshots.py. Usage:
//   node lab_screenshots.mjs live  URL OUT_DIR   run every cell of a training notebook, screenshot the
//                                                live view with its group of samples, click Stop
//   node lab_screenshots.mjs view  URL OUT_DIR   screenshot an executed notebook, reopened
//   node lab_screenshots.mjs runall URL OUT_DIR NAME DONE_TEXT [MID_NAME]
//                                                run every cell (scripts/lab_launch_screenshots.py), wait for
//                                                DONE_TEXT in the outputs, screenshot OUT_DIR/NAME.png; with
//                                                MID_NAME also OUT_DIR/MID_NAME.png once 2 step lines streamed
import { chromium } from "playwright-core";

const [mode, url, out, name, doneText, midName] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"] });
const page = await browser.newPage({ viewport: mode === "runall" ? { width: 1500, height: 1300 } : { width: 1400, height: 1100 } });
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
  // poll the DOM (a busy page can starve Playwright's locator waits): the Stop button and a group
  let ready = false;
  for (let i = 0; i < 120 && !ready; i++) {
    await page.waitForTimeout(3000);
    ready = await page.evaluate(() => !!document.querySelector(".rft-group") &&
      [...document.querySelectorAll("button")].some(b => b.textContent.includes("Stop (checkpoint first)")));
  }
  log(`live view ready: ${ready}`);
  await page.evaluate(() => document.querySelector(".rft-group")?.closest(".widget-vbox")?.scrollIntoView());
  await page.waitForTimeout(1000);
  const panel = page.locator(".widget-vbox", { has: page.locator(".rft-group") }).first();
  await page.screenshot({ path: `${out}/live_view.png` });
  await panel.screenshot({ path: `${out}/live_view_panel.png`, timeout: 60000 }).catch(e => log(`panel: ${e.message}`));
  const clicked = await page.evaluate(() => {
    const b = [...document.querySelectorAll("button")].find(b => b.textContent.includes("Stop (checkpoint first)"));
    if (b) b.click();
    return !!b;
  });
  log(`Stop clicked: ${clicked}`);
  let acked = false;
  for (let i = 0; i < 40 && !acked; i++) {
    await page.waitForTimeout(1500);
    acked = await page.evaluate(() => [...document.querySelectorAll("button")].some(b => b.textContent.includes("Stopping after this step")));
  }
  log(`Stop acknowledged while the cell runs: ${acked}`);
  await panel.screenshot({ path: `${out}/live_view_stopping.png`, timeout: 60000 }).catch(e => log(`panel: ${e.message}`));
  // this branch's trainer may not check control/stop yet: interrupt the kernel to end the demo
  await page.evaluate(() => window.jupyterapp.commands.execute("kernelmenu:interrupt"));
  log("kernel interrupted");
  await page.waitForTimeout(5000);
} else if (mode === "runall") {
  await page.waitForFunction(() => window.jupyterapp && document.querySelector(".jp-Notebook-ExecutionIndicator, .jp-Toolbar"),
    null, { timeout: 180000 });
  await page.waitForTimeout(8000);
  // not awaited in the page: execute()'s promise resolves only when every cell has run
  await page.evaluate(() => { window.jupyterapp.commands.execute("notebook:run-all-cells"); });
  log("run all cells");
  const outText = () => page.evaluate(() => [...document.querySelectorAll(".jp-OutputArea-output")].map(o => o.innerText).join("\n"));
  // the output of the launch cell (the third cell), scrolled to its last line
  const showRunOutput = () => page.evaluate(() => {
    const outs = document.querySelectorAll(".jp-Cell")[2]?.querySelectorAll(".jp-OutputArea-output");
    if (outs && outs.length) outs[outs.length - 1].scrollIntoView({ block: "end" });
  });
  // JupyterLab's "get notified about news?" toast would cover the outputs
  const noNews = () => page.evaluate(() => [...document.querySelectorAll(".jp-toast-button, button")]
    .find(b => b.textContent.trim() === "No")?.click());
  let done = false, mid = !midName;
  for (let i = 0; i < 200 && !done; i++) {
    await page.waitForTimeout(2000);
    const text = await outText();
    done = text.includes(doneText);
    if (midName) log(`poll ${i}: ${(text.match(/\[rft\] step \d+/g) || []).length} step lines`);
    await noNews();
    if (!mid && (text.match(/\[rft\] step \d+/g) || []).length >= 2) {
      await showRunOutput();
      await page.waitForTimeout(500);
      await page.screenshot({ path: `${out}/${midName}.png` });
      log(`${midName}.png: ${(text.match(/\[rft\] step \d+/g) || []).length} step lines so far`);
      mid = true;
    }
  }
  log(`"${doneText}" in the outputs: ${done}`);
  await page.waitForTimeout(1500);
  // the end of the launch cell's output and the status cell below it
  await page.evaluate(() => document.querySelectorAll(".jp-Cell")[4]?.scrollIntoView({ block: "end" }));
  await page.waitForTimeout(800);
  await page.screenshot({ path: `${out}/${name}.png` });
  log(`${name}.png written; outputs:\n${await outText()}`);
} else {
  await page.waitForTimeout(2000);
  await page.screenshot({ path: `${out}/executed_top.png` });
  const img = page.locator(".jp-RenderedImage img").first();
  await img.scrollIntoViewIfNeeded();
  await page.waitForTimeout(800);
  await page.screenshot({ path: `${out}/executed_plot.png` });
}
await browser.close();
