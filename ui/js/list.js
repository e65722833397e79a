// A list the server pages, sorts and filters (RabbitMQ's page, page_size,
// name, use_regex, sort and sort_reverse): the page never holds more than
// one page of items, however many there are.

import { get } from "./api.js";
import { h, num, table } from "./dom.js";

const PAGE_SIZES = [20, 50, 100, 500];

// A list of `path` shown with `columns` (see dom.table); returns its
// element and a refresh function.
export function pagedList(path, columns, opts = {}) {
  const state = { page: 1, size: opts.size || 50, name: "", regex: false, sort: opts.sort || "name", reverse: false };
  const filter = h("input", { type: "text", placeholder: "Filter by name", name: "filter" });
  const regex = h("input", { type: "checkbox", name: "regex" });
  const size = h("select", { name: "page_size" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === state.size }, n)));
  const info = h("span", { class: "muted" });
  const prev = h("button", { onclick: () => { state.page = Math.max(1, state.page - 1); refresh(); } }, "\u2039 Prev");
  const next = h("button", { onclick: () => { state.page++; refresh(); } }, "Next \u203A");
  // Only the newest request's answer is shown (a slow poll may answer
  // after the user changed the page, filter or sort).
  let asked = 0;
  const body = h("div");
  let timer;
  filter.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.name = filter.value; state.page = 1; refresh(); }, 250);
  });
  regex.addEventListener("change", () => { state.regex = regex.checked; state.page = 1; refresh(); });
  size.addEventListener("change", () => { state.size = Number(size.value); state.page = 1; refresh(); });
  const onSort = (key) => {
    state.reverse = state.sort === key ? !state.reverse : false;
    state.sort = key;
    refresh();
  };
  async function refresh() {
    const mine = ++asked;
    const q = new URLSearchParams({
      page: state.page, page_size: state.size, name: state.name, use_regex: state.regex,
      sort: state.sort, sort_reverse: state.reverse,
    });
    if (opts.columns) q.set("columns", opts.columns);
    const r = await get(`${path}?${q}`);
    if (mine !== asked) return;
    if (r.page_count > 0 && state.page > r.page_count) {
      state.page = r.page_count;
      return refresh();
    }
    prev.disabled = state.page <= 1;
    next.disabled = state.page >= r.page_count;
    info.textContent = `Page ${r.page} of ${Math.max(1, r.page_count)} \u00B7 ${num(r.filtered_count)} shown of ${num(r.total_count)}`;
    body.replaceChildren(table(columns, r.items, { sorted: { key: state.sort, reverse: state.reverse }, onSort, empty: opts.empty }));
  }
  const el = h("div", { class: "paged" },
    h("div", { class: "toolbar pager" }, filter, h("label", {}, regex, " regex"), "Page size", size, prev, next, info),
    body);
  return { el, refresh };
}
