// The UI's shell: login, navigation by the URL's hash, and the poll that
// keeps the page's live parts current. Each page (pages/*.js) renders
// into the view and returns a refresh function the poll calls.

import { credentials, login, logout, get } from "./api.js";
import { h } from "./dom.js";
import * as overview from "./pages/overview.js";
import * as connections from "./pages/connections.js";
import * as exchanges from "./pages/exchanges.js";
import * as queues from "./pages/queues.js";
import * as admin from "./pages/admin.js";

const POLL_MS = 5000;

const SECTIONS = [
  ["", "Overview", overview.page],
  ["connections", "Connections", connections.connectionsPage],
  ["channels", "Channels", connections.channelsPage],
  ["exchanges", "Exchanges", exchanges.page],
  ["queues", "Queues", queues.page],
  ["admin", "Admin", admin.page],
];

export const session = { user: null };

// Shows `text` for a few seconds; `ok` false marks it an error.
export function flash(text, ok = true) {
  const el = h("div", { class: ok ? "ok" : "err" }, text);
  document.getElementById("flash").append(el);
  setTimeout(() => el.remove(), ok ? 3000 : 8000);
}

// Runs `f` (an API call), flashing `done` or the API's error; whether it
// succeeded.
export async function act(f, done) {
  try {
    await f();
    if (done) flash(done);
    refresh();
    return true;
  } catch (e) {
    flash(e.message, false);
    return false;
  }
}

let current = { refresh: null, token: 0 };

function decode(s) {
  try { return decodeURIComponent(s); } catch { return s; }
}

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decode);
  const name = parts[0] || "";
  return { name, params: parts.slice(1) };
}

function nav(active) {
  const el = document.getElementById("nav");
  el.replaceChildren(...SECTIONS.map(([path, label]) =>
    h("a", { href: "#/" + path, class: path === active ? "on" : null }, label)));
  const who = document.getElementById("who");
  who.replaceChildren(
    session.user ? `${session.user.name} (${session.user.tags.join(", ") || "no tags"})` : "",
    session.user ? h("button", { onclick: () => { logout(); session.user = null; show(); } }, "Log out") : "",
  );
}

export async function refresh() {
  const token = current.token;
  if (!current.refresh) return;
  try {
    await current.refresh();
  } catch (e) {
    if (token === current.token) flash(e.message, false);
  }
}

async function show() {
  const view = document.getElementById("view");
  current = { refresh: null, token: current.token + 1 };
  if (!credentials() || !session.user) {
    if (credentials()) {
      try { session.user = await get("/whoami"); } catch { logout(); }
      if (session.user) return show();
    }
    nav(null);
    return showLogin(view);
  }
  const { name, params } = route();
  const section = SECTIONS.find(([path]) => path === name) || SECTIONS[0];
  nav(section[0]);
  // A page of its own: one still loading when the user moves on fills a
  // container no longer shown.
  const page = h("div");
  view.replaceChildren(page);
  const token = current.token;
  try {
    const r = await section[2](page, params);
    if (token === current.token) current.refresh = r || null;
  } catch (e) {
    page.append(h("p", { class: "empty" }, e.message));
  }
}

function showLogin(view) {
  const user = h("input", { type: "text", name: "username", autocomplete: "username", autofocus: true });
  const pass = h("input", { type: "password", name: "password", autocomplete: "current-password" });
  const error = h("p", { class: "err muted" });
  const f = h("form", { class: "box login", id: "login" },
    h("h1", {}, "Warren management"),
    h("div", { class: "row" }, h("label", {}, "Username"), user),
    h("div", { class: "row" }, h("label", {}, "Password"), pass),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary" }, "Log in")),
    error);
  f.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      session.user = await login(user.value, pass.value);
      show();
    } catch (err) {
      error.textContent = err.status === 401 ? "Login failed" : err.message;
    }
  });
  view.replaceChildren(f);
}

window.addEventListener("hashchange", show);
setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
show();
