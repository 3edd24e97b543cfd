// Drive a real JupyterLab with Debian's Chromium (playwright-core, executablePath: no browser
// download) for scripts/lab_screenshots.py. Usage:
//   node lab_screenshots.mjs live  URL OUT_DIR   run every cell of a training notebook, screenshot the
//                                                live view with its group of samples, click Stop, wait for
//                                                the trainer to stop; what the page saw -> OUT_DIR/live.json
//   node lab_screenshots.mjs view  URL OUT_DIR   screenshot an executed notebook, reopened
//   node lab_screenshots.mjs runall URL OUT_DIR NAME DONE_TEXT [MID_NAME]
//                                                run every cell (scripts/lab_launch_screenshots.py), wait for
//                                                DONE_TEXT in the outputs, screenshot OUT_DIR/NAME.png; with
//                                                MID_NAME also OUT_DIR/MID_NAME.png once 2 step lines streamed
//   node lab_screenshots.mjs replay URL OUT_DIR NAME   run every cell of replay.ipynb, wait for FAITHFUL and the
//                                                inspector's iframe: OUT_DIR/NAME.png (verdict, table),
//                                                OUT_DIR/NAME_inspector.png, what it saw -> OUT_DIR/replay.json
import fs from "node:fs";
import { chromium } from "playwright-core";

const [mode, url, out, name, doneText, midName] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"] });
const page = await browser.newPage({ viewport: mode === "runall" || mode === "replay" ? { width: 1500, height: 1300 } : { width: 1400, height: 1100 } });
const log = (m) => console.log(`[lab_screenshots] ${m}`);
await page.goto(url, { waitUntil: "domcontentloaded", timeout: 180000 });
await page.waitForSelector(".jp-Notebook", { timeout: 180000 });
await page.waitForTimeout(3000);

if (mode === "live") {
  // wait for the kernel, then Run > Run All Cells through the app's command registry (not awaited:
  // its promise resolves only once every cell has run)
  await page.waitForFunction(() => window.jupyterapp && document.querySelector(".jp-Notebook-ExecutionIndicator, .jp-Toolbar"),
    null, { timeout: 180000 });
  await page.waitForTimeout(8000);
  await page.evaluate(() => { window.jupyterapp.commands.execute("notebook:run-all-cells"); });
  log("run all cells");
  // what the page saw, for scripts/lab_screenshots.py to check against the attempt's files
  const seen = { ready: false, clicked: false, acked: false, cell_ended: false, interrupted: false };
  const save = () => fs.writeFileSync(`${out}/live.json`, JSON.stringify(seen, null, 1));
  const button = (text) => page.evaluate((t) => [...document.querySelectorAll("button")].find(b => b.textContent.includes(t))
    ?.textContent.trim() ?? null, text);
  // the panel's own step ("step N/M" of its status line): where the run is when Stop is clicked
  const panelStep = () => page.evaluate(() => {
    const m = document.querySelector(".rft-group")?.closest(".widget-vbox")?.innerText.match(/step (\d+)\/\d+/);
    return m ? Number(m[1]) : null;
  });
  // poll the DOM (a busy page can starve Playwright's locator waits) for the Stop button and a group of
  // samples, i.e. a step has been drawn; the model load and the step-0 eval come first
  for (let i = 0; i < 200 && !seen.ready && !seen.error; i++) {
    await page.waitForTimeout(3000);
    seen.ready = !!(await page.evaluate(() => !!document.querySelector(".rft-group"))) &&
      (await button("Stop (checkpoint first)")) !== null;
    seen.error = await page.evaluate(() => [...document.querySelectorAll(".jp-OutputArea-output")]
      .map(o => o.innerText).join("\n").match(/^\w*(Error|Exception)\b.*$/m)?.[0] ?? null);
  }
  if (seen.error) log(`a cell failed: ${seen.error}`);
  log(`live view ready: ${seen.ready}`);
  // JupyterLab's "get notified about news?" toast would cover the panel
  await page.evaluate(() => [...document.querySelectorAll(".jp-toast-button, button")]
    .find(b => b.textContent.trim() === "No")?.click());
  await page.evaluate(() => document.querySelector(".rft-group")?.closest(".widget-vbox")?.scrollIntoView());
  await page.waitForTimeout(1000);
  const panel = page.locator(".widget-vbox", { has: page.locator(".rft-group") }).first();
  await page.screenshot({ path: `${out}/live_view.png` });
  await panel.screenshot({ path: `${out}/live_view_panel.png`, timeout: 60000 }).catch(e => log(`panel: ${e.message}`));
  seen.step_at_click = await panelStep();
  seen.clicked = await page.evaluate(() => {
    const b = [...document.querySelectorAll("button")].find(b => b.textContent.includes("Stop (checkpoint first)"));
    if (b) b.click();
    return !!b;
  });
  log(`Stop clicked at step ${seen.step_at_click}: ${seen.clicked}`);
  // the kernel ran the click's handler while the cell runs: the button says so (or, a tiny step later,
  // already where the stop took effect)
  for (let i = 0; i < 100 && !seen.acked; i++) {
    await page.waitForTimeout(100);
    seen.acked = (await button("Stopping after this step") ?? await button("Stopped at step")) !== null;
  }
  log(`Stop acknowledged while the cell runs: ${seen.acked}`);
  await panel.screenshot({ path: `${out}/live_view_stopping.png`, timeout: 60000 }).catch(e => log(`panel: ${e.message}`));
  // the trainer checkpoints after its step and returns; the view's finish() then relabels the button
  for (let i = 0; i < 200 && !seen.cell_ended; i++) {
    await page.waitForTimeout(1500);
    seen.button_after = await button("Stopped at step") ?? await button("Run finished");
    seen.cell_ended = seen.button_after !== null;
  }
  log(`the training cell ended by itself: ${seen.cell_ended} (button: ${seen.button_after})`);
  if (!seen.cell_ended) {  // the stop was not honoured: end the demo the hard way, and say so
    await page.evaluate(() => window.jupyterapp.commands.execute("kernelmenu:interrupt"));
    seen.interrupted = true;
    log("kernel interrupted");
  }
  const text = await page.evaluate(() => [...document.querySelectorAll(".jp-OutputArea-output")].map(o => o.innerText).join("\n"));
  seen.health_lines = (text.match(/\[health step \d+\]/g) || []).length;
  seen.early_stop_line = (text.match(/\[early stop at step \d+\][^\n]*/) || [null])[0];
  save();
  // the panel after the stop, with the trainer's line under it
  await page.evaluate(() => {
    const outs = [...document.querySelectorAll(".jp-OutputArea-output")].filter(o => o.innerText.includes("[early stop at step"));
    (outs[0] ?? document.querySelector(".rft-group"))?.scrollIntoView({ block: "end" });
  });
  await page.waitForTimeout(1500);
  await page.screenshot({ path: `${out}/live_view_stopped.png` });
  log(`live.json: ${JSON.stringify(seen)}`);
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
} else if (mode === "replay") {
  // replay.ipynb (issue 33): run every cell, wait for the verdict, then the table and the inspector's iframe
  await page.waitForFunction(() => window.jupyterapp && document.querySelector(".jp-Notebook-ExecutionIndicator, .jp-Toolbar"),
    null, { timeout: 180000 });
  await page.waitForTimeout(8000);
  await page.evaluate(() => { window.jupyterapp.commands.execute("notebook:run-all-cells"); });
  const outText = () => page.evaluate(() => [...document.querySelectorAll(".jp-OutputArea-output")].map(o => o.innerText).join("\n"));
  const seen = { faithful: false, iframe: false, cards: 0, errors: 0 };
  for (let i = 0; i < 150; i++) {
    await page.waitForTimeout(2000);
    await page.evaluate(() => [...document.querySelectorAll(".jp-toast-button, button")].find(b => b.textContent.trim() === "No")?.click());
    const text = await outText();
    seen.faithful = text.includes("FAITHFUL");
    seen.iframe = await page.evaluate(() => !!document.querySelector(".jp-OutputArea-output iframe"));
    if (seen.faithful && seen.iframe) break;
  }
  seen.errors = await page.evaluate(() => document.querySelectorAll(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] .ansi-red-fg, .jp-RenderedText[data-mime-type='application/vnd.jupyter.error']").length);
  await page.evaluate(() => document.querySelectorAll(".jp-Cell")[4]?.scrollIntoView({ block: "end" }));
  await page.waitForTimeout(1000);
  await page.screenshot({ path: `${out}/${name}.png` });
  // the inspector: the iframe holds the same page the report links; count its group cards
  await page.evaluate(() => document.querySelector(".jp-OutputArea-output iframe")?.scrollIntoView({ block: "start" }));
  await page.waitForTimeout(3000);
  for (const f of page.frames()) {
    try { seen.cards = Math.max(seen.cards, await f.evaluate(() => document.querySelectorAll(".rft-group, .group-card, [data-group]").length)); } catch (e) { }
  }
  await page.screenshot({ path: `${out}/${name}_inspector.png` });
  fs.writeFileSync(`${out}/replay.json`, JSON.stringify(seen));
  log(`replay.json: ${JSON.stringify(seen)}`);
} else {
  await page.waitForTimeout(2000);
  await page.screenshot({ path: `${out}/executed_top.png` });
  const img = page.locator(".jp-RenderedImage img").first();
  await img.scrollIntoViewIfNeeded();
  await page.waitForTimeout(800);
  await page.screenshot({ path: `${out}/executed_plot.png` });
}
await browser.close();
