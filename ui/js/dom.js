// Small DOM helpers the pages share: an element builder, formatting, a
// sortable table and a form.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function num(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return "";
  return Math.round(n).toLocaleString("en-US");
}

export function rate(r) {
  if (r === undefined || r === null) return "";
  return (r >= 10 ? Math.round(r) : Math.round(r * 10) / 10).toLocaleString("en-US") + "/s";
}

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function link(href, text) {
  return h("a", { href }, text);
}

// A table of `rows`; columns are {label, value(row) -> node or text,
// num?, sort?}. `sorted` = {key, reverse} marks the column sorted on, and
// `onSort(key)` makes sortable headers clickable.
export function table(columns, rows, opts = {}) {
  if (!rows || rows.length === 0) return h("p", { class: "empty" }, opts.empty || "Nothing here.");
  const head = columns.map((c) => {
    const cls = [c.num ? "num" : "", c.sort && opts.onSort ? "sort" : ""];
    if (opts.sorted && c.sort === opts.sorted.key) cls.push(opts.sorted.reverse ? "desc" : "asc");
    return h("th", {
      class: cls.join(" ").trim() || null,
      onclick: c.sort && opts.onSort ? () => opts.onSort(c.sort) : null,
    }, c.label);
  });
  const body = rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.value(r)))));
  return h("table", { class: opts.class }, opts.head === false ? null : h("thead", {}, h("tr", {}, head)), h("tbody", {}, body));
}

// A two-column table of [label, value] pairs (values left undefined are
// left out).
export function pairs(list) {
  const rows = list.filter((p) => p[1] !== undefined);
  return table([{ label: "", value: (p) => h("strong", {}, p[0]) }, { label: "", value: (p) => p[1] }], rows, { head: false, class: "pairs" });
}

// A form in a box: fields are {name, label, type?, value?, options?,
// placeholder?}; `submit(values)` runs on submit, and the form is
// cleared when it succeeds.
export function form(title, fields, button, submit, opts = {}) {
  const inputs = {};
  const rows = fields.map((f) => {
    let input;
    if (f.options) {
      input = h("select", { name: f.name }, f.options.map((o) => {
        const [v, t] = Array.isArray(o) ? o : [o, o];
        return h("option", { value: v, selected: v === f.value }, t);
      }));
    } else if (f.type === "textarea") {
      input = h("textarea", { name: f.name, placeholder: f.placeholder });
      input.value = f.value || "";
    } else if (f.type === "checkbox") {
      input = h("input", { type: "checkbox", name: f.name, checked: f.value });
    } else {
      input = h("input", { type: f.type || "text", name: f.name, value: f.value, placeholder: f.placeholder });
    }
    inputs[f.name] = input;
    return h("div", { class: "row" }, h("label", { for: f.name }, f.label), input);
  });
  const el = h("form", { class: "box", "data-form": opts.id || null }, title ? h("strong", {}, title) : null, rows,
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, button)));
  el.addEventListener("submit", async (e) => {
    e.preventDefault();
    const values = {};
    for (const [k, i] of Object.entries(inputs)) values[k] = i.type === "checkbox" ? i.checked : i.value;
    const ok = await submit(values);
    if (ok !== false && !opts.keep) el.reset();
  });
  return el;
}

// "k=v" lines (values JSON when they parse, strings else) as an object.
export function parseArgs(text) {
  const out = {};
  for (const line of (text || "").split("\n")) {
    const i = line.indexOf("=");
    if (i <= 0) continue;
    const k = line.slice(0, i).trim();
    const raw = line.slice(i + 1).trim();
    try { out[k] = JSON.parse(raw); } catch { out[k] = raw; }
  }
  return out;
}

export function args(obj) {
  const entries = Object.entries(obj || {});
  if (entries.length === 0) return "";
  return entries.map(([k, v]) => h("div", {}, h("span", { class: "tag" }, k), typeof v === "object" ? JSON.stringify(v) : String(v)));
}

// Replaces `el`'s children with `children` (flattened, empty ones left out).
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false && c !== ""));
}
