// Overview: queued messages and message rates over the last ten minutes,
// object totals, the nodes (memory and disk against their alarms, role in
// the cluster), listeners, and the definitions' download and upload.

import { api, get } from "../api.js";
import { h, fill, num, bytes, table } from "../dom.js";
import { chart, points, ratePoints } from "../chart.js";
import { act, flash } from "../app.js";

export const AGE = 600;
export const HISTORY = `lengths_age=${AGE}&lengths_incr=5&msg_rates_age=${AGE}&msg_rates_incr=5`;

function card(label, n) {
  return h("div", { class: "card" }, h("div", { class: "n" }, num(n)), h("div", { class: "l" }, label));
}

function gauge(used, limit, alarm) {
  const pct = limit ? Math.min(100, (used / limit) * 100) : 0;
  return h("div", { class: alarm ? "bar alarm" : "bar", title: `${bytes(used)} of ${bytes(limit)}` },
    h("span", { style: `width:${pct.toFixed(1)}%` }));
}

export function messageCharts(totals, stats) {
  const age = AGE * 1000;
  const depth = (label, key) => ({ label, points: points(totals[`${key}_details`]), now: totals[key] || 0 });
  const rate = (label, key) => {
    const d = stats[`${key}_details`];
    return { label, points: ratePoints(d), now: (d && d.rate) || 0 };
  };
  return h("div", { class: "charts" },
    chart("Queued messages", [
      depth("Ready", "messages_ready"), depth("Unacked", "messages_unacknowledged"), depth("Total", "messages"),
    ], age),
    chart("Message rates", [
      rate("Publish", "publish"), rate("Deliver / get", "deliver_get"), rate("Ack", "ack"), rate("Confirm", "confirm"),
    ], age, "/s"));
}

function nodes(list) {
  return table([
    { label: "Name", value: (n) => n.name },
    { label: "Role", value: (n) => (n.raft && n.raft.role) || (n.running ? "single node" : "") },
    { label: "Running", value: (n) => (n.running ? "yes" : "no") },
    { label: "Memory", value: (n) => h("div", {}, gauge(n.mem_used, n.mem_limit, n.mem_alarm), `${bytes(n.mem_used)} / ${bytes(n.mem_limit)}`) },
    { label: "Disk free", value: (n) => h("div", {}, gauge(n.disk_free_limit, n.disk_free, n.disk_free_alarm), `${bytes(n.disk_free)} (alarm below ${bytes(n.disk_free_limit)})`) },
    { label: "Uptime", value: (n) => (n.uptime ? `${Math.round(n.uptime / 60000)} min` : "") },
  ], list);
}

function definitions() {
  const download = h("button", {
    onclick: async () => {
      try {
        const defs = await get("/definitions");
        const a = h("a", {
          href: URL.createObjectURL(new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" })),
          download: `warren-definitions-${new Date().toISOString().slice(0, 10)}.json`,
        });
        document.body.append(a);
        a.click();
        a.remove();
      } catch (e) { flash(e.message, false); }
    },
  }, "Download definitions");
  const file = h("input", { type: "file", accept: ".json,application/json", name: "definitions" });
  const upload = h("button", {
    onclick: async () => {
      const f = file.files[0];
      if (!f) return flash("Choose a definitions file first", false);
      let defs;
      try { defs = JSON.parse(await f.text()); } catch (e) { return flash(`Not JSON: ${e.message}`, false); }
      act(() => api("POST", "/definitions", defs), "Definitions imported");
    },
  }, "Upload");
  return h("div", { class: "toolbar" }, download, h("span", { class: "muted" }, "or import:"), file, upload);
}

export async function page(view) {
  const live = h("div");
  view.append(h("h1", {}, "Overview"), live, h("h2", {}, "Definitions"), definitions());
  const refresh = async () => {
    const [o, ns] = await Promise.all([get(`/overview?${HISTORY}`), get("/nodes")]);
    const t = o.object_totals || {};
    const q = o.queue_totals || {};
    fill(live,
      h("div", { class: "cards" },
        card("Messages", q.messages), card("Ready", q.messages_ready), card("Unacked", q.messages_unacknowledged),
        card("Connections", t.connections), card("Channels", t.channels), card("Exchanges", t.exchanges),
        card("Queues", t.queues), card("Consumers", t.consumers)),
      messageCharts(q, o.message_stats || {}),
      h("h2", {}, `Nodes (${o.cluster_name || o.node})`), nodes(ns),
      h("h2", {}, "Listeners"),
      table([
        { label: "Protocol", value: (l) => l.protocol },
        { label: "Address", value: (l) => l.ip_address },
        { label: "Port", value: (l) => l.port, num: true },
      ], o.listeners));
  };
  await refresh();
  return refresh;
}
