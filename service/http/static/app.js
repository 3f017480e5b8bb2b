// The playground: one panel per served model and a status strip, on the public API only
// (GET /models, GET /stats, POST /classify, POST /fill-mask). Plain DOM, no framework, no build.
"use strict";

const SAMPLES = ["cat", "dog", "horse", "bird", "frog", "airplane"];
const TOP_K = 5;
const STATS_EVERY_MS = 2000;
const keyInput = document.getElementById("key");

// --- talking to the API -------------------------------------------------------------------

function headers(extra) {
  const key = keyInput.value.trim();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

// The server's own time (Server-Timing `total`) when it sends one, else the round trip.
function timing(response, startedAt) {
  const header = response.headers.get("Server-Timing") || "";
  const total = header.split(",").map((m) => m.trim()).find((m) => /^total\b/.test(m));
  const dur = total && /dur=([\d.]+)/.exec(total);
  if (dur) return { ms: Number(dur[1]), source: "server" };
  return { ms: performance.now() - startedAt, source: "round trip" };
}

class ApiError extends Error {
  constructor(status, statusText, body) {
    super(`HTTP ${status}`);
    Object.assign(this, { status, statusText, body });
  }
}

async function call(path, init = {}) {
  const startedAt = performance.now();
  const response = await fetch(path, { ...init, headers: headers(init.headers) });
  const text = await response.text();
  let body = text;
  try { body = JSON.parse(text); } catch { /* not JSON: shown as it came */ }
  if (!response.ok) throw new ApiError(response.status, response.statusText, body);
  return { body, time: timing(response, startedAt) };
}

// A task call, after which the status strip is brought up to date at once.
async function predict(path, init) {
  try {
    return await call(path, init);
  } finally {
    refreshStats();
  }
}

// --- small DOM helpers --------------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

const percent = (score) => `${(100 * score).toFixed(score >= 0.1 ? 1 : 2)}%`;
const ms = (value) => (value == null ? "–" : value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`);

function bars(items, labelOf) {
  const top = Math.max(...items.map((i) => i.score), 1e-9);
  return el("ol", { className: "bars" }, ...items.map((item) => {
    const fill = el("span", { className: "fill" });
    fill.style.setProperty("--w", `${(100 * item.score) / top}%`);
    return el("li", {},
      el("span", { className: "label" }, labelOf(item)),
      el("span", { className: "bar", ariaHidden: "true" }, fill),
      el("span", { className: "score" }, percent(item.score)));
  }));
}

// Every refusal as the server worded it: status, machine code, message, and the body itself.
function showError(output, error) {
  if (!(error instanceof ApiError)) {
    output.replaceChildren(el("div", { className: "error", role: "alert" },
      el("strong", {}, "The request did not complete"), el("p", {}, String(error))));
    return;
  }
  const detail = error.body && error.body.error;
  const message = typeof detail === "string" ? detail : detail && detail.message;
  const code = detail && detail.code ? ` · ${detail.code}` : "";
  const raw = typeof error.body === "string" ? error.body : JSON.stringify(error.body, null, 2);
  output.replaceChildren(el("div", { className: "error", role: "alert" },
    el("strong", {}, `HTTP ${error.status} ${error.statusText}${code}`),
    el("p", { className: "message" }, message || "(no message)"),
    el("pre", {}, raw)));
}

function showTime(time) {
  const what = time.source === "server" ? "server time" : "round trip (measured here)";
  return el("p", { className: "timing" }, `${ms(time.ms)} · ${what}`);
}

// --- the model panels ---------------------------------------------------------------------

function card(panel, model) {
  panel.querySelector(".name").textContent = model.name;
  const text = model.card && model.card.description;
  panel.querySelector(".card-text").textContent = text || "";
  const facts = [["task", model.task], ["n", model.n], ["variant", model.variant], ["provider", model.provider]];
  panel.querySelector(".facts").replaceChildren(...facts.map(([k, v]) =>
    el("div", {}, el("dt", {}, k), el("dd", {}, String(v ?? "–")))));
  // The card's top-1 figures (all of them when it has none), for the variant served.
  const figures = Object.entries((model.card && model.card.accuracy) || {});
  const top1 = figures.filter(([what]) => what.endsWith("top1"));
  const shown = (top1.length ? top1 : figures).map(([what, value]) => `${what} ${percent(value)}`);
  panel.querySelector(".accuracy").textContent = shown.length
    ? `Accuracy (${model.card.measured}, from the model card): ${shown.join(" · ")}` : "";
}

function classifierPanel(model, panel) {
  const input = panel.querySelector(".file");
  const preview = panel.querySelector(".preview");
  const output = panel.querySelector(".output");
  const drop = panel.querySelector(".drop");
  input.id = `file-${model.name}`;

  async function classify(blob, name) {
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(blob);
    preview.alt = `the image sent: ${name}`;
    preview.hidden = false;
    output.replaceChildren(el("p", { className: "note" }, "Classifying…"));
    const form = new FormData();
    form.append("file", blob, name);
    const query = new URLSearchParams({ model: model.name, top_k: TOP_K });
    try {
      const { body, time } = await predict(`classify?${query}`, { method: "POST", body: form });
      output.replaceChildren(showTime(time), bars(body.predictions, (p) => p.label));
    } catch (error) {
      showError(output, error);
    }
  }

  panel.classify = (file) => classify(file, file.name || "pasted image");
  input.addEventListener("change", () => input.files[0] && panel.classify(input.files[0]));
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    const file = event.dataTransfer.files[0];
    if (file) panel.classify(file);
  });
  panel.querySelector(".samples").append(...SAMPLES.map((sample) => {
    const src = `ui/samples/${sample}.jpg`;
    const button = el("button", { type: "button", className: "sample", title: `Classify the ${sample}` },
      el("img", { src, alt: `sample: ${sample}`, width: 48, height: 48 }));
    button.addEventListener("click", async () => {
      const response = await fetch(src);
      classify(await response.blob(), `${sample}.jpg`);
    });
    return button;
  }));
}

function fillMaskPanel(model, panel) {
  const form = panel.querySelector("form");
  const text = panel.querySelector(".text");
  const output = panel.querySelector(".output");
  text.id = `text-${model.name}`;
  panel.querySelector(".text-label").htmlFor = text.id;

  panel.querySelector(".insert").addEventListener("click", () => {
    text.setRangeText("[MASK]", text.selectionStart, text.selectionEnd, "end");
    text.focus();
  });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    output.replaceChildren(el("p", { className: "note" }, "Predicting…"));
    const request = { model: model.name, text: text.value, top_k: TOP_K };
    try {
      const { body, time } = await predict("fill-mask", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(request),
      });
      output.replaceChildren(showTime(time), filled(request.text, body.predictions),
        ...body.predictions.map((ranked, i) => el("section", { className: "mask" },
          el("h3", {}, `[MASK] ${i + 1}`), bars(ranked, (p) => p.token_str))));
    } catch (error) {
      showError(output, error);
    }
  });
}

// The text with each [MASK] replaced by its first prediction, highlighted.
function filled(text, predictions) {
  const parts = text.split("[MASK]");
  const sentence = el("p", { className: "filled" }, parts[0]);
  parts.slice(1).forEach((part, i) => {
    const best = predictions[i] && predictions[i][0];
    sentence.append(el("mark", {}, best ? best.token_str : "[MASK]"), part);
  });
  return sentence;
}

const PANELS = { "image-classification": classifierPanel, "fill-mask": fillMaskPanel };

async function loadModels() {
  const main = document.getElementById("models");
  const note = document.getElementById("models-note");
  try {
    const { body } = await call("models");
    if (!body.models.length) throw new Error("no model is loaded yet");
    note.remove();
    for (const model of body.models) {
      const template = document.getElementById(model.task);
      if (!template) continue;
      const panel = template.content.firstElementChild.cloneNode(true);
      card(panel, model);
      PANELS[model.task](model, panel);
      main.append(panel);
    }
  } catch (error) {
    note.textContent = error instanceof ApiError
      ? `GET /models: HTTP ${error.status} ${JSON.stringify(error.body)} (retrying)`
      : `Waiting for the models: ${error.message}`;
    setTimeout(loadModels, STATS_EVERY_MS);
  }
}

// A pasted image goes to the classifier panel holding the focus, else the first one.
document.addEventListener("paste", (event) => {
  const file = [...event.clipboardData.files].find((f) => f.type.startsWith("image/"));
  const panels = [...document.querySelectorAll(".panel")].filter((p) => p.classify);
  const target = panels.find((p) => p.contains(document.activeElement)) || panels[0];
  if (file && target) {
    event.preventDefault();
    target.classify(file);
  }
});

// --- the status strip ---------------------------------------------------------------------

function sparkline(values) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 100 24");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-hidden", "true");
  const points = values.map((v) => v ?? 0);
  const top = Math.max(...points, 1e-9);
  const step = points.length > 1 ? 100 / (points.length - 1) : 100;
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.map((v, i) => `${(i * step).toFixed(1)},${(22 - (20 * v) / top).toFixed(1)}`).join(" "));
  svg.append(line);
  return svg;
}

function setText(id, value) {
  document.getElementById(id).textContent = value;
}

async function refreshStats() {
  if (document.hidden) return;
  try {
    const { body } = await call("stats");
    const pill = document.getElementById("s-status");
    pill.textContent = body.status;
    pill.dataset.state = body.status;
    const w = body.window;
    setText("s-requests", Math.round(body.requests_total).toLocaleString("en"));
    setText("s-rate", w.requests_per_s.toFixed(w.requests_per_s < 10 ? 2 : 0));
    setText("s-p50", ms(w.p50_ms));
    setText("s-p99", ms(w.p99_ms));
    setText("s-queue", String(Math.round(w.queue_depth)));
    setText("s-batch", w.batch_size == null ? "–" : w.batch_size.toFixed(1));
    const minutes = Math.max(1, Math.round(w.seconds / 60));
    setText("s-note", `Served requests over the last ${minutes} min, from /stats (probes and this page's polling not counted).`);
    for (const stat of document.querySelectorAll("[data-series]")) {
      stat.querySelector("svg")?.remove();
      if (body.series.length > 1) stat.append(sparkline(body.series.map((p) => p[stat.dataset.series])));
    }
  } catch (error) {
    setText("s-status", error instanceof ApiError ? `HTTP ${error.status}` : "unreachable");
    document.getElementById("s-status").dataset.state = "failed";
    const detail = error instanceof ApiError ? JSON.stringify(error.body) : String(error);
    setText("s-note", `GET /stats: ${detail}`);
  }
}

keyInput.value = sessionStorage.getItem("gmlp-key") || "";
document.getElementById("key-form").addEventListener("submit", (event) => event.preventDefault());
keyInput.addEventListener("change", () => {
  sessionStorage.setItem("gmlp-key", keyInput.value.trim());
  refreshStats();
});
loadModels();
refreshStats();
setInterval(refreshStats, STATS_EVERY_MS);
